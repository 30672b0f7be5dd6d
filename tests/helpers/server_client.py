"""Run the app in-process for tests: lifespan + an httpx client on the ASGI transport."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from devices import DEVICE
from fastapi import FastAPI

from server.app import create_app
from server.config import Settings
from server.state import Service

# What the test servers price a forward at (``forward_cost_s``), not what this machine's forwards
# take: admission (422 too_costly, 429) then does not follow how busy the machine is. Above a
# quiet 2-core CPU's forward of the bundled model (about 0.04 s), so work admitted at this price
# finishes in its deadline with room to spare. Tests of the measured time set it to None.
FORWARD_COST_S = 0.1


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a ``sedd serve`` subprocess: one thread, ``FORWARD_COST_S``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "SEDD_FORWARD_COST_S": str(FORWARD_COST_S),
            **extra}  # fmt: skip


@contextmanager
def serve_subprocess(*flags: str, **env: str) -> Iterator[str]:
    """A real ``sedd serve`` (uvicorn) in its own process, one thread, with ``flags`` and
    ``env`` (``server_env``'s extras); its URL once ``/readyz`` answers 200 (asked with the
    ``SEDD_API_KEY`` of ``env``, if any). Terminated on exit."""
    port = free_port()
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--port", str(port), *flags]
    proc = subprocess.Popen(argv, env=server_env(**env))
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
    key = env.get("SEDD_API_KEY")
    probe = {} if key is None else {"Authorization": b"Bearer " + key.encode("utf-8")}
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "sedd serve exited"
            try:
                if httpx.get(f"{base}/readyz", headers=probe, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def make_settings(model: Path, **overrides: Any) -> Settings:
    """Small limits, fp32 on the test device (so results match a solo run bit for bit)."""
    values: dict[str, Any] = {
        "model": model,
        "device": str(DEVICE),
        "precision": "fp32",
        "max_cells_per_request": 8,
        "max_steps": 20,
        "max_body_bytes": 4096,
        "max_queued_jobs": 64,
        "max_rows_per_forward": 64,
        "request_timeout_s": 30.0,
        "api_key": None,
        "forward_cost_s": FORWARD_COST_S,
    }
    return Settings(**{**values, **overrides})


def slow_down(service: Service, seconds: float) -> None:
    """Every model forward sleeps ``seconds`` first (queueing and deadline tests)."""
    service.loaded.model.register_forward_pre_hook(lambda module, args: time.sleep(seconds))


@asynccontextmanager
async def served(
    settings: Settings, *, slow_s: float = 0.0
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        if slow_s:
            slow_down(app.state.service, slow_s)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sedd.test") as client:
            yield client, app


@contextmanager
def uvicorn_in_thread(app: Any, protocol: type, port: int) -> Iterator[int]:
    """A real uvicorn server of ``app`` with the h11 ``protocol`` class, in a daemon thread on
    ``port``: the port once it listens; stopped on exit."""
    config = uvicorn.Config(app, port=port, http=protocol, ws="none", lifespan="off",
                            log_level="critical", timeout_graceful_shutdown=1)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
