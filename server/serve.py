"""Run the app under uvicorn with the shutdown docs/service.md documents ("Shutdown").

uvicorn's own answer to SIGTERM closes the listener at once (new clients get "connection
refused") and waits for open connections without a limit of its own. ``DrainingServer`` instead,
on the first SIGTERM or SIGINT:

1. marks the service draining: the listener stays open and new requests get a JSON 503 with
   ``Retry-After`` (``server.http.guard``), ``/readyz`` says not ready;
2. lets the requests in flight finish for up to ``drain_timeout_s`` (0 and values under 1 s are
   honoured as given);
3. cuts the engine off: jobs still running are failed at once, without waiting for the step
   under way, and their requests answered with a JSON 503 at the deadline;
4. then lets uvicorn close the listener and exit, ``EXIT_GRACE_S`` at most later.

A second signal cuts every request in flight off with a JSON 503 at once, gives the responses
``CUT_GRACE_S`` to be written, and ends the process (exit status 1) without waiting for the
engine's step under way: within about a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from server.config import Settings
from server.http.protocol import KEEP_ALIVE_S, TimedH11Protocol
from server.model_host import ModelHost

log = logging.getLogger("sedd.server")
EXIT_GRACE_S = 3.0  # after the drain: time for the last responses to be written
CUT_GRACE_S = 1.0  # after a second signal: time for the cut requests' 503s to be written
_POLL_S = 0.05


def _in_flight(state: object) -> int:
    return int(getattr(state, "in_flight", 0))  # set when the middleware stack is built


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain above; ``app`` is the FastAPI app it serves."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._drain: asyncio.Task[None] | None = None
        self._cut: asyncio.Task[None] | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: runs between two bytecodes of the event loop's thread.
        if self._loop is None:  # not serving yet
            self.should_exit = True
            return
        if self._drain_requested:  # a second signal: cut everything off and exit now
            self._loop.call_soon_threadsafe(self._start_cut)
            return
        self._drain_requested = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_cut(self) -> None:
        if self._cut is None:
            self._cut = asyncio.ensure_future(self.cut())

    async def cut(self) -> None:
        """The second signal: every request in flight gets its JSON 503 now, then the process
        ends, whatever step the engine is in."""
        state = self.app.state
        host: ModelHost | None = state.host
        state.draining = True
        if host is not None:
            host.cut()
        log.warning("second signal: %d request(s) cut off; exiting", _in_flight(state))
        grace = time.monotonic() + CUT_GRACE_S
        while _in_flight(state) > 0 and time.monotonic() < grace:
            await asyncio.sleep(_POLL_S)
        await asyncio.sleep(_POLL_S)  # the last response's bytes to the socket
        logging.shutdown()
        os._exit(1)  # a step under way (and the threads waiting on it) would delay a clean exit

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        state = self.app.state
        host: ModelHost | None = state.host
        timeout = float(state.settings.drain_timeout_s)
        state.draining = True
        if host is not None:
            host.drain()
        log.info("draining: %d request(s) in flight, up to %g s", _in_flight(state), timeout)
        deadline = time.monotonic() + timeout
        while _in_flight(state) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        if host is not None:  # jobs still running are cut off now (their requests get 503)
            host.cut()
        grace = time.monotonic() + EXIT_GRACE_S
        while _in_flight(state) > 0 and time.monotonic() < grace:
            await asyncio.sleep(_POLL_S)
        log.info("drained; %d request(s) still open; shutting down", _in_flight(state))
        self.should_exit = True


def serve(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then drain as described above. Connections speak
    ``server.http.protocol.TimedH11Protocol`` (header and body timeouts, early answers closed, JSON
    400s and 503s, no WebSocket), ``max_connections`` of them admitted at once."""
    protocol = TimedH11Protocol.configured(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        write_timeout_s=settings.write_timeout_s,
        max_connections=settings.max_connections,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        http=protocol,
        ws="none",  # no WebSocket route: an Upgrade header is ignored (server.http.protocol)
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=EXIT_GRACE_S,
    )
    DrainingServer(config, app).run()
