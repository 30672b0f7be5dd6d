"""Run a planned job on the engine without blocking the event loop ("predict").

The engine resolves each job's ``concurrent.futures.Future`` on its own thread; here it is
awaited through ``asyncio.wrap_future``. While waiting, the client connection and the deadline
are watched (the ASGI disconnect message, and a timeout at the deadline): a client that went away
gets its job cancelled (its rows leave the batch at the next step), and a job past its deadline is
cancelled and answered 504 even if the engine has not noticed yet.

Both kinds of route take one path, ``job_events``: the event streams send its events as they
come, and the JSON routes drain it for the result, as TGI's ``generate`` drains
``generate_stream``; so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from sedd.defaults import SamplingOptions
from sedd.engine import JobCancelled, JobHandle, JobResult, StepProgress
from sedd.request.plan import GenerationRequest, plan
from server.encoding import finite_or_zero
from server.errors import ClientDisconnected, DeadlineExceeded, Draining
from server.http.errors import error_event
from server.intake import PlannedJob, check_cost
from server.metrics import outcome_for_status
from server.state import Service

log = logging.getLogger("sedd.server")

DEADLINE_GRACE_S = 1.0  # the engine's own deadline check answers first; this is the backstop


def submit(
    service: Service,
    planned: PlannedJob,
    on_progress: Callable[[StepProgress], None] | None = None,
) -> JobHandle:
    """Queue the job after its admission by cost (``server.intake.check_cost``: a 422
    ``too_costly`` FieldError, or a 429 ``Overloaded``); raises the engine's EngineFull /
    EngineStopped / ValueError."""
    if service.draining:
        raise Draining("the server is shutting down and takes no new requests")
    check_cost(service, planned)
    return service.engine.submit(planned.job, on_progress=on_progress)


async def warm_up(service: Service) -> None:
    """Two 1-cell, 1-step jobs of the model's default condition at start-up, before the first
    request. The first is cold (on CUDA: cuBLAS handles, module loads, allocator growth, graph
    capture); only the second, warm one sets the forward time that ``server.intake.check_cost``
    prices with, or every request's cost would be overstated and some refused that would
    finish."""
    loaded, engine = service.loaded, service.engine
    condition = loaded.config.control_label or (loaded.conditions or [None])[0]
    names = [condition] if loaded.conditional and condition is not None else None
    request = GenerationRequest(1, names, None, SamplingOptions.resolve(1))
    observer, engine.observer = engine.observer, None  # not a request: not in the metrics

    def tick_under_way() -> bool:
        started, ended = engine.tick_started_monotonic, engine.last_tick_monotonic
        return started is not None and (ended is None or ended < started)

    try:
        await asyncio.wrap_future(engine.submit(plan(loaded, request).job()).future)  # cold
        engine.restart_timing()  # safe: a job is handed back after its last tick is timed
        await asyncio.wrap_future(engine.submit(plan(loaded, request).job()).future)  # warm
    except Exception as err:  # a model that fails here fails its requests the same way
        log.warning("warm-up job failed (%s); requests are not cost-checked yet", err)
    finally:
        # A failed job is handed back inside its tick, which writes its end afterwards: wait
        # for that end (a second at most: a tick that raised never writes it), then forget.
        deadline = time.monotonic() + 1.0
        while tick_under_way() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        engine.observer = observer
        engine.last_tick_monotonic = engine.tick_started_monotonic = None  # still never stepped


def _consume(future: asyncio.Future[JobResult]) -> None:
    """Mark an abandoned job's outcome as seen (asyncio would log it as never retrieved)."""
    if not future.cancelled():
        future.exception()


async def _client_gone(request: Request) -> None:
    """Return once the client has disconnected. The body has been read already (LimitedRoute),
    so the next ASGI message can only be ``http.disconnect``: no polling, no GIL churn next to
    the engine thread."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _result(service: Service, future: asyncio.Future[JobResult]) -> JobResult:
    try:
        return future.result()
    except JobCancelled:
        if service.draining:  # the drain ran out of time and cut this job off
            raise Draining("the server shut down before this request finished") from None
        raise


async def _wait(
    service: Service, handle: JobHandle, request: Request, planned: PlannedJob
) -> JobResult:
    future = asyncio.wrap_future(handle.future)
    future.add_done_callback(_consume)
    gone = asyncio.ensure_future(_client_gone(request))
    deadline = planned.job.deadline
    timeout = None if deadline is None else deadline + DEADLINE_GRACE_S - service.engine.clock()
    try:
        done, _ = await asyncio.wait(
            {future, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if future in done:
            return _result(service, future)
        handle.cancel()
        if gone in done:
            raise ClientDisconnected("the client disconnected; its job was cancelled")
        raise DeadlineExceeded()
    except asyncio.CancelledError:
        handle.cancel()
        raise
    finally:
        gone.cancel()


@dataclasses.dataclass(frozen=True)
class Queued:
    """The job was accepted (the first event)."""

    job_id: str


@dataclasses.dataclass(frozen=True)
class Done:
    """The job finished (the last event)."""

    result: JobResult


JobEvent = Queued | StepProgress | Done


async def job_events(
    service: Service, planned: PlannedJob, request: Request, route: str, *, progress: bool = True
) -> tuple[JobHandle, AsyncGenerator[JobEvent, None]]:
    """Submit now (so a full queue is a plain 429 on either route) and return the job's events:
    ``Queued``, a ``StepProgress`` per step (with ``progress``), then ``Done``, after which its
    queue time is recorded. A failure is raised from the iterator (the client gone, the deadline
    passed, the engine's errors), for the route to answer. The one path of both routes: the JSON
    route drains it (``run_job``), the event stream sends it (``stream_job``)."""
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue[StepProgress] = asyncio.Queue()

    def on_progress(update: StepProgress) -> None:  # engine thread
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            loop.call_soon_threadsafe(updates.put_nowait, update)

    handle = submit(service, planned, on_progress if progress else None)

    async def events() -> AsyncGenerator[JobEvent, None]:
        waiter = asyncio.ensure_future(_wait(service, handle, request, planned))
        getter: asyncio.Future[StepProgress] | None = None
        try:
            yield Queued(str(handle.job_id))
            while not waiter.done() or not updates.empty():
                getter = asyncio.ensure_future(updates.get())
                await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            result = waiter.result()  # raises the job's failure
            service.metrics.queue_seconds.labels(route, service.model_id).observe(
                result.queue_seconds
            )
            yield Done(result)
        finally:
            if getter is not None and not getter.done():
                getter.cancel()
            if not waiter.done():  # abandoned: the client went away mid-stream, or the request
                request.scope["sedd.outcome"] = "cancelled"  # was cancelled; so is its job
                waiter.cancel()
                handle.cancel()

    return handle, events()


async def run_job(
    service: Service, planned: PlannedJob, request: Request, route: str
) -> tuple[str, JobResult]:
    """The JSON routes: ``job_events`` drained (no progress), as an event stream would be; returns
    (job id, result). Failures propagate to the app's one mapping (``server.errors.http_error``)."""
    handle, events = await job_events(service, planned, request, route, progress=False)
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Done):
                return str(handle.job_id), event.result
    raise AssertionError("a job's events end with Done or raise")  # never reached


def sse_event(event: str, data: Any) -> str:
    """One server-sent event; ``data`` as compact JSON on one line."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), allow_nan=False)}\n\n"


async def stream_job(
    service: Service,
    planned: PlannedJob,
    request: Request,
    route: str,
    encode: Callable[[JobResult], Any],
    error_body: Callable[[BaseException], tuple[int, Any]],
) -> tuple[JobHandle, AsyncIterator[str]]:
    """``job_events`` as server-sent events (submitted now, so a full queue is a plain 429).

    Events: ``queued`` once, ``progress`` per step ({step, steps, rows, fraction_masked}),
    then ``result`` (the same body as the JSON route) or ``error`` ({status, detail}).
    """
    handle, events = await job_events(service, planned, request, route)

    async def sse() -> AsyncIterator[str]:
        try:
            while True:
                try:
                    event = await anext(events)
                except Exception as exc:  # every failure becomes an error event, then the end
                    status, detail = error_body(exc)
                    request.scope["sedd.outcome"] = outcome_for_status(status)
                    yield sse_event("error", error_event(status, detail))
                    return
                if isinstance(event, Done):
                    yield sse_event("result", encode(event.result))
                    return
                if isinstance(event, Queued):
                    yield sse_event("queued", {"job_id": event.job_id})
                else:
                    yield sse_event("progress", _progress_dict(event))
        finally:
            await events.aclose()  # a client gone mid-stream: its job is cancelled there

    return handle, sse()


def _progress_dict(update: StepProgress) -> dict[str, Any]:
    return {
        "step": int(update.step),
        "steps": int(update.steps),
        "rows": int(update.rows),
        "fraction_masked": finite_or_zero(float(update.fraction_masked)),
        "fraction_unmasked": finite_or_zero(float(update.fraction_unmasked)),
        "cells_finished": int(update.finished),
    }
