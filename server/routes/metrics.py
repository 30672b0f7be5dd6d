"""GET /metrics: Prometheus text format from the app's own registry, or, behind Ray Serve, every
replica's, each sample labelled by ``replica`` (``app.state.gather_metrics``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from server.deps import ServiceDep
from server.http.limits import LimitedRoute
from server.metrics import CONTENT_TYPE

router = APIRouter(route_class=LimitedRoute, tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
async def metrics(service: ServiceDep, request: Request) -> Response:
    gather = getattr(request.app.state, "gather_metrics", None)
    text = await gather() if gather is not None else service.metrics.render()
    return Response(text, media_type=CONTENT_TYPE)
