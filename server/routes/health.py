"""GET /healthz (liveness, no auth) and GET /readyz (model loaded, engine stepping)."""

from __future__ import annotations

from fastapi import APIRouter

from server.deps import ServiceDep
from server.errors import NotReady
from server.http.limits import LimitedRoute
from server.responses import ErrorBody, Health, Readiness

router = APIRouter(route_class=LimitedRoute, tags=["health"])
STALL_S = 60.0  # an engine with work that has not stepped for this long is not ready


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": ErrorBody, "description": "not ready"}},
    summary="Readiness: the model is loaded and the engine is stepping or idle",
)
async def readyz(service: ServiceDep) -> Readiness:
    engine = service.engine
    if service.draining or not engine.running:
        raise NotReady("not ready: the engine is not running (starting or shutting down)")
    last = engine.last_tick_monotonic
    since = None if last is None else engine.clock() - last
    busy = engine.active_jobs > 0 or engine.queued_jobs > 0
    # stalled: work waits and no tick has begun or ended for STALL_S (time spent idle, with no
    # work, is not a stall: the first tick after it starts as soon as work arrives)
    moments = [t for t in (last, engine.tick_started_monotonic) if t is not None]
    quiet = None if not moments else engine.clock() - max(moments)
    if busy and quiet is not None and quiet > STALL_S:
        raise NotReady(f"not ready: the engine has work but has not stepped for {quiet:.0f} s")
    return Readiness(
        queued_jobs=engine.queued_jobs,
        active_jobs=engine.active_jobs,
        active_rows=engine.active_rows,
        seconds_since_step=since,
    )
