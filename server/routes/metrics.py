"""GET /metrics: Prometheus text format from the app's own registry."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from server.deps import AuthDep, ServiceDep
from server.limits import LimitedRoute
from server.metrics import CONTENT_TYPE

router = APIRouter(route_class=LimitedRoute, dependencies=[AuthDep], tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
async def metrics(service: ServiceDep) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
