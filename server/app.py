"""The app factory: ``create_app(settings)``.

The lifespan loads the fp32 checkpoint once, with the side files the settings name (gene names,
perturbation map, vectors: what ``sedd generate`` takes), unless ``sedd serve`` loaded it already
(so that a bad checkpoint is a one-line error before the server starts); it resolves the
precision policy, starts one engine and publishes them as ``app.state.service``; on shutdown it
stops taking requests and drains the engine (``server.serve`` drains on SIGTERM first).
``server.http.guard`` checks the API key and the drain before any route runs (the one check of
the key). Every error reaches the client through ``server.errors.http_error`` (installed here as
the app's exception handlers), its body written by ``server.http.errors``.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sedd.checkpoints import load_checkpoint
from sedd.checkpoints.labels import PositionalGenesWarning
from sedd.engine import Engine
from sedd.engine.monitor import Monitor
from sedd.precision import resolve_precision
from server.config import Settings
from server.errors import MAPPED, http_error
from server.http.errors import error_response, excerpt
from server.http.guard import GuardMiddleware
from server.metrics import RATE_WINDOW_S, MetricsMiddleware, ServiceMetrics
from server.openapi import apply_auth, apply_limits
from server.routes import health, metrics, models, sampling
from server.runner import warm_up
from server.state import Service

log = logging.getLogger("sedd.server")


def load_service(settings: Settings, service_metrics: ServiceMetrics) -> Service:
    """Load the model, build (not start) the engine, and start the app's monitor."""
    device = settings.resolved_device()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        loaded = load_checkpoint(
            settings.model,
            genes=settings.genes,
            perturbations=settings.perturbation_map,
            vectors=settings.vectors,
            device=device,
        )
        precision = resolve_precision(settings.precision, loaded.device)
    for warning in caught:
        if issubclass(warning.category, PositionalGenesWarning):  # how the server takes it
            log.warning("%s (sedd serve: --genes FILE or SEDD_GENES=FILE)", warning.message)
        else:
            log.warning("%s", warning.message)
    engine = Engine.for_model(
        loaded,
        precision,
        max_rows_per_forward=settings.max_rows_per_forward,
        tokens_per_forward=settings.tokens_per_forward,
        cuda_graphs=settings.cuda_graphs,
        max_queued_jobs=settings.max_queued_jobs,
        max_rows_in_flight=settings.rows_in_flight,
        fair=True,
        observer=service_metrics,
        forward_cost_s=settings.forward_cost_s,
        whole_blocks=True,  # a full tick computes no padding rows
    )
    monitor = Monitor(loaded.device, loaded.config.num_genes, window_s=RATE_WINDOW_S).start()
    service_metrics.attach(engine, monitor)
    return Service(settings, loaded, precision, engine, service_metrics)


def preload(app: FastAPI) -> Service:
    """Load the model for ``app`` now (errors surface here, not in uvicorn's lifespan)."""
    app.state.preloaded = load_service(app.state.settings, app.state.metrics)
    return app.state.preloaded


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    service = app.state.preloaded
    if service is None:
        service = await asyncio.to_thread(load_service, settings, app.state.metrics)
    app.state.preloaded = None
    service.engine.start()
    await warm_up(service)  # the forward time, measured before the first request
    app.state.service = service
    log.info("%s", startup_line(service))
    try:
        yield
    finally:
        service.draining = True
        log.info("draining the engine (up to %.0f s)", settings.drain_timeout_s)
        await asyncio.to_thread(service.engine.stop, drain=True, timeout=settings.drain_timeout_s)
        app.state.service = None


def startup_line(service: Service) -> str:
    """One line: what is served, where, and under which limits."""
    loaded, settings = service.loaded, service.settings
    config = loaded.config
    labels = len(loaded.conditions) or "no"
    return (
        f"serving {loaded.path} ({config.architecture}, {config.num_genes} genes, {labels} "
        f"labels) on {loaded.device}, precision {service.precision.name}; limits: "
        f"{settings.max_cells_per_request} cells and {settings.max_steps} steps per request, "
        f"{settings.max_queued_jobs} queued jobs, {settings.rows_in_flight} cells in flight "
        "(shared fairly), "
        f"{service.engine.max_rows_per_forward} rows a step (max_rows_per_forward "
        f"{settings.max_rows_per_forward}, rounded up to whole blocks) in forwards of "
        f"{service.engine.sampler.block_rows} rows; "
        f"API key {'required' if settings.api_key else 'off'}; "
        f"http://{settings.host}:{settings.port}"
    )


async def _domain_error(request: Request, exc: Exception) -> Response:
    failure = http_error(exc)
    return error_response(failure.status, failure.detail, failure.headers)


async def _http_exception(request: Request, exc: Exception) -> Response:
    exc = cast(StarletteHTTPException, exc)  # registered for this type only
    return error_response(exc.status_code, exc.detail, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    exc = cast(RequestValidationError, exc)
    fields = _body_fields(request)
    errors = [_suggest({k: v for k, v in e.items() if k != "url"}, fields) for e in exc.errors()]
    for error in errors:
        if "input" in error:
            error["input"] = excerpt(error["input"])
    return error_response(422, _jsonable(errors))


def _body_fields(request: Request) -> list[str]:
    """The field names of the route's body model (none for a route without a body)."""
    body = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body, "field_info", None), "annotation", None)
    return list(getattr(model, "model_fields", {}))


def _suggest(error: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """An unknown body field's error, with the closest field names as the CLI gives them."""
    loc = error.get("loc", ())
    if error.get("type") != "extra_forbidden" or len(loc) != 2 or not fields:
        return error
    close = difflib.get_close_matches(str(loc[1]), fields, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return {
        **error,
        "msg": f"unknown field {loc[1]!r}{hint} (fields: {', '.join(fields)})",
        "ctx": {"suggestions": close},
    }


def _jsonable(value: Any) -> Any:
    """Validation errors may carry exceptions or NaN inputs in ``ctx``/``input``: make them
    plain, finite JSON."""
    match value:
        case dict():
            return {str(k): _jsonable(v) for k, v in value.items()}
        case list() | tuple():
            return [_jsonable(v) for v in value]
        case float() if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        case str() | int() | float() | bool() | None:
            return value
        case _:
            return str(value)


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app serving ``settings`` (``Settings()`` from the environment when None).

    ``preload(app)`` loads the model now instead of in the lifespan.
    """
    settings = settings if settings is not None else Settings()
    app = FastAPIOffline(  # FastAPI, with /docs and /redoc assets from the installed package
        title="sedd",
        summary="Discrete-diffusion (SEDD) single-cell count models over HTTP",
        version="0.1.0",
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.service = None
    app.state.preloaded = None
    app.state.draining = False
    app.state.metrics = ServiceMetrics()
    for router in (health.router, models.router, metrics.router, sampling.router):
        app.include_router(router)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    for error in MAPPED:
        app.add_exception_handler(error, _domain_error)
    app.add_exception_handler(Exception, _domain_error)  # the rest: a logged JSON 500
    app.add_middleware(GuardMiddleware, state=app.state)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: counts all

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            service = app.state.service
            config = None if service is None else service.loaded.config
            schema = apply_auth(apply_limits(schema, settings, config), settings)
            if config is None:
                return schema  # before start-up: no model names yet, so do not cache
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
