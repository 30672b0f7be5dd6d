"""The app factory: ``create_app(settings)``.

The lifespan builds the app's ``ModelHost`` (``server.model_host``: one model, or a repository of
them) and loads its default model (``server.service_loading``: the fp32 checkpoint with the side
files the settings name, its precision policy and engine), unless ``sedd serve`` loaded it
already (so that a bad checkpoint is a one-line error before the server starts); it starts the
engines' thread and publishes the host as ``app.state.host`` and the default model's service as
``app.state.service``; on shutdown it stops taking requests and drains every engine
(``server.serve`` drains on SIGTERM first).
``server.http.guard`` checks the API key and the drain before any route runs (the one check of
the key). Every error reaches the client through ``server.errors.http_error`` (installed here as
the app's exception handlers), its body written by ``server.http.errors``.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from server.config import Settings
from server.errors import MAPPED, http_error
from server.http.errors import error_response, excerpt
from server.http.guard import GuardMiddleware
from server.metrics import MetricsMiddleware, ServiceMetrics
from server.model_host import ModelHost
from server.openapi import apply_auth, apply_limits
from server.routes import health, metrics, models, sampling
from server.runner import warm_up
from server.state import Service

log = logging.getLogger("sedd.server")
ADMIN_PATHS = ("/v1/models/{model_id}/load", "/v1/models/{model_id}/unload")  # --model-admin


def preload(app: FastAPI) -> Service:
    """Load the default model for ``app`` now (errors surface here, not in uvicorn's
    lifespan); its ``ModelHost`` waits in ``app.state.preloaded``."""
    host = ModelHost(app.state.settings, app.state.metrics)
    service = host.load_now(host.default_id)
    app.state.preloaded = host
    return service


def _load_host(settings: Settings, metrics: ServiceMetrics) -> ModelHost:
    host = ModelHost(settings, metrics)
    host.load_now(host.default_id)
    return host


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    host: ModelHost | None = app.state.preloaded
    if host is None:
        host = await asyncio.to_thread(_load_host, settings, app.state.metrics)
    app.state.preloaded = None
    host.load_hook = getattr(app.state, "model_hook", None)  # a Ray replica's, with --models
    host.group.start()
    service = host.default
    await warm_up(service)  # the forward time, measured before the first request
    app.state.host, app.state.service = host, service
    log.info("%s", startup_line(service))
    if settings.serves_many:
        log.info("models: %s (default %s, at most %d loaded)", ", ".join(host.ids),
                 host.default_id, settings.max_loaded_models)  # fmt: skip
        for name, why in host.skipped.items():
            log.warning("not served: %s/%s: %s", settings.models, name, why)
    try:
        yield
    finally:
        log.info("draining the engine (up to %.0f s)", settings.drain_timeout_s)
        await asyncio.to_thread(host.stop, settings.drain_timeout_s)
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
    app.state.service = None  # the default model's, from start-up to shutdown
    app.state.host = None  # every model's (``server.model_host``)
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
            service, host = app.state.service, app.state.host
            # one model: its names as enums; several: the names depend on the body's model
            single = host is not None and len(host.ids) == 1
            config = service.loaded.config if service is not None and single else None
            schema = apply_auth(apply_limits(schema, settings, config), settings)
            if not settings.model_admin:  # routes that answer 403 are not advertised
                for path in ADMIN_PATHS:
                    schema["paths"].pop(path, None)
            if service is None:
                return schema  # before start-up: no model names yet, so do not cache
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
