"""POST /generate, /predict, /impute and their server-sent-event variants ``.../stream``.

Each route is intake (``server.intake``: body -> request -> plan; the cost check comes with the
submit) -> run on the engine (``server.runner``) -> encode (``server.encoding``); errors go to
the app's one mapping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response

from sedd.engine import JobResult
from server import encoding, intake
from server.deps import HostDep
from server.errors import FieldError, http_error
from server.events import stream_responses
from server.http.limits import LimitedRoute
from server.model_host import ModelHost
from server.responses import ErrorBody, GenerateResponse, ImputeResponse, PredictResponse
from server.runner import run_job, stream_job
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest, SamplingOptions
from server.state import Service

router = APIRouter(route_class=LimitedRoute, tags=["sampling"])

BodyFn = Callable[[Service, intake.PlannedJob, JobResult, str], dict[str, Any]]
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (401, "missing or wrong API key"),
        (404, "the body's `model` is none of the served models (GET /v1/models lists them)"),
        (413, "request body over max_body_bytes"),
        (422, "a field is out of bounds or names something the model does not know"),
        (429, "the queue is full; see Retry-After"),
        (500, "the model produced NaN/Inf for this request"),
        (
            503,
            "the server is draining, out of accelerator memory, or must load the body's model "
            "while every loaded one is busy; see Retry-After",
        ),
        (504, "the request's deadline passed"),
    )
}
_H5AD = {
    200: {"content": {encoding.H5AD_MEDIA_TYPE: {"schema": {"type": "string"}}}},
    507: {"model": ErrorBody, "description": "no room for an .h5ad answer on the server's "
          "temporary disk; see Retry-After, or ask for JSON"},
}  # fmt: skip


async def _routed(
    host: ModelHost,
    body: SamplingOptions,
    request: Request,
    route: str,
    encode: BodyFn,
    answer: Callable[..., Awaitable[Response]],
) -> Response:
    """The body's model (``"model"``, else the default; loaded now if it is not), held while
    the body is planned and its job submitted (``ModelHost.serving``); its deadline counts from
    now, so a load's wait is part of it."""
    arrived = host.default.engine.clock()
    async with host.serving(body.model) as service:
        request.scope["sedd.model"] = service.model_id  # the requests' series label
        planned = intake.plan_body(
            service.loaded, service.settings, body, service.engine.clock, arrived=arrived
        )
        return await answer(service, planned, request, route, encode)


async def _answer(
    service: Service, planned: intake.PlannedJob, request: Request, route: str, body: BodyFn
) -> Response:
    job_id, result = await run_job(service, planned, request, route)
    if encoding.wants_h5ad(planned, request):
        return await encoding.h5ad_response(service, planned, result, route)
    return JSONResponse(body(service, planned, result, job_id))


async def _stream(
    service: Service, planned: intake.PlannedJob, request: Request, route: str, body: BodyFn
) -> StreamingResponse:
    if planned.options.format != "json":
        raise FieldError(
            ["body", "format"],
            "streaming responses carry JSON; use the non-streaming route for h5ad",
            input=planned.options.format,
        )

    def encode(result: JobResult) -> dict[str, Any]:
        return body(service, planned, result, str(handle.job_id))

    def error_body(exc: BaseException) -> tuple[int, Any]:
        failure = http_error(exc)
        return failure.status, failure.detail

    handle, events = await stream_job(service, planned, request, route, encode, error_body)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses={**_ERRORS, **_H5AD},
    summary="Generate whole cells",
)
async def generate(body: GenerateRequest, host: HostDep, request: Request) -> Response:
    return await _routed(host, body, request, "/generate", encoding.generate_body, _answer)


@router.post(
    "/generate/stream",
    responses={**_ERRORS, **stream_responses(GenerateResponse)},
    response_class=StreamingResponse,
    summary="Generate whole cells, streaming per-step progress (server-sent events)",
)
async def generate_stream(
    body: GenerateRequest, host: HostDep, request: Request
) -> StreamingResponse:
    return await _routed(host, body, request, "/generate/stream", encoding.generate_body, _stream)


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses={**_ERRORS, **_H5AD},
    summary="Predict perturbation responses",
)
async def predict(body: PredictRequest, host: HostDep, request: Request) -> Response:
    return await _routed(host, body, request, "/predict", encoding.predict_body, _answer)


@router.post(
    "/predict/stream",
    responses={**_ERRORS, **stream_responses(PredictResponse)},
    response_class=StreamingResponse,
    summary="Predict perturbation responses, streaming per-step progress",
)
async def predict_stream(
    body: PredictRequest, host: HostDep, request: Request
) -> StreamingResponse:
    return await _routed(host, body, request, "/predict/stream", encoding.predict_body, _stream)


@router.post(
    "/impute",
    response_model=ImputeResponse,
    responses={**_ERRORS, **_H5AD},
    summary="Sample the genes a cell's given counts leave out",
)
async def impute(body: ImputeRequest, host: HostDep, request: Request) -> Response:
    return await _routed(host, body, request, "/impute", encoding.impute_body, _answer)


@router.post(
    "/impute/stream",
    responses={**_ERRORS, **stream_responses(ImputeResponse)},
    response_class=StreamingResponse,
    summary="Impute, streaming per-step progress",
)
async def impute_stream(body: ImputeRequest, host: HostDep, request: Request) -> StreamingResponse:
    return await _routed(host, body, request, "/impute/stream", encoding.impute_body, _stream)
