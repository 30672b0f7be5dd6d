"""``sedd serve`` under real uvicorn in a subprocess: SIGTERM drains as docs/service.md
("Shutdown") says.

Each SIGTERM test stops its own server (all are started at once, before the first test). The
CLI's one-line errors (start-up faults of ``sedd serve`` included) are in
tests/commands/test_cli_errors.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_client import free_port, server_env

# a real `sedd serve` (uvicorn) in a subprocess: CI's slow step, not the README's command
pytestmark = pytest.mark.slow

SEDD = [sys.executable, "-m", "sedd.cli"]
Server = tuple[subprocess.Popen[str], int]  # (the `sedd serve` process, its port)


def _env(**extra: str) -> dict[str, str]:
    return server_env(SEDD_DEBUG="", **extra)


def _spawn(port: int, drain_s: str) -> subprocess.Popen[str]:
    argv = [*SEDD, "serve", "--port", str(port), "--precision", "fp32", "--device", "cpu"]
    return subprocess.Popen(
        argv, env=_env(SEDD_DRAIN_TIMEOUT_S=drain_s), stderr=subprocess.PIPE, text=True
    )


def _wait_ready(proc: subprocess.Popen[str], port: int) -> subprocess.Popen[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not become ready: {proc.communicate()[1][-2000:]}")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    """One server per SIGTERM test (name -> (process, port)), all starting at once; each test
    waits for its own and stops it."""
    started: dict[str, Server] = {}
    try:
        for name, drain_s in (("drain 20 s", "20"), ("drain 0.5 s", "0.5"), ("two", "60")):
            port = free_port()
            started[name] = (_spawn(port, drain_s), port)
        yield started
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def _post_in_background(url: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def post() -> None:
        result["response"] = httpx.post(url, json=body, timeout=120)

    thread = threading.Thread(target=post)
    thread.start()
    result["thread"] = thread
    return result


def _sigterm_with(server: Server, steps: int) -> tuple[Any, httpx.Response, float]:
    """Wait for ``server``, send a ``steps``-step request, SIGTERM while it runs, then one new
    request. Returns (the in-flight response, the new request's response, seconds from SIGTERM
    to exit)."""
    proc, port = server
    _wait_ready(proc, port)
    url = f"http://127.0.0.1:{port}/generate"
    long = _post_in_background(url, {"num_cells": 1, "steps": steps, "condition": "CD19+ B"})
    time.sleep(1.0)  # the request is running
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    time.sleep(0.3)
    late = httpx.post(url, json={"num_cells": 1, "steps": 2}, timeout=30)
    long["thread"].join(timeout=120)
    proc.wait(timeout=60)
    return long["response"], late, time.monotonic() - sent


def test_sigterm_refuses_new_requests_with_json_503_and_finishes_in_flight(
    servers: dict[str, Server],
) -> None:
    in_flight, late, took = _sigterm_with(servers["drain 20 s"], steps=80)
    assert late.status_code == 503 and late.headers["retry-after"] == "5"
    assert late.json() == {"detail": "the server is shutting down and takes no new requests"}
    assert in_flight.status_code == 200 and len(in_flight.json()["counts"]) == 1
    assert took < 20  # it exits once the in-flight request is answered, not at the limit


def test_a_drain_under_one_second_is_honoured_and_cut_requests_get_json_503(
    servers: dict[str, Server],
) -> None:
    in_flight, late, took = _sigterm_with(servers["drain 0.5 s"], steps=1000)
    assert late.status_code == 503
    assert in_flight.status_code == 503
    assert in_flight.json() == {"detail": "the server is shutting down and takes no new requests"}
    assert int(in_flight.headers["retry-after"]) >= 1
    assert took < 0.5 + 6  # drain + the exit grace, never the request's own length


def test_a_second_signal_cuts_requests_off_with_json_503_and_exits_at_once(
    servers: dict[str, Server],
) -> None:
    proc, port = servers["two"]
    _wait_ready(proc, port)
    url = f"http://127.0.0.1:{port}/generate"
    long = _post_in_background(url, {"num_cells": 1, "steps": 1000, "condition": "CD19+ B"})
    time.sleep(1.0)  # the request is running
    proc.send_signal(signal.SIGTERM)  # a drain of up to 60 s begins
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # the second: now
    second = time.monotonic()
    proc.wait(timeout=30)
    took = time.monotonic() - second
    long["thread"].join(timeout=30)
    response = long["response"]
    assert took < 2.0, took
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert response.json() == {"detail": "the server is shutting down and takes no new requests"}
    assert proc.returncode == 1
