"""Real uvicorn (``sedd serve``): a head that never completes is closed at the header timeout
with a JSON 408, a request h11 cannot parse gets a JSON 400, and requests that could only hold
the engine past their deadline are refused at once, so a small one behind them is served."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from server_client import free_port, server_env

# a real `sedd serve` (uvicorn) in a subprocess: CI's slow step, not the README's command
pytestmark = pytest.mark.slow

HEADER_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--port", str(port), "--precision", "fp32",
            "--device", "cpu", "--header-timeout-s", str(HEADER_TIMEOUT_S)]  # fmt: skip
    env = server_env()
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "sedd serve exited"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if s.recv(100).startswith(b"HTTP/1.1 200"):
                    break
        except OSError:
            time.sleep(0.2)
    yield port
    proc.terminate()
    proc.wait(30)


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_connections_that_never_send_a_whole_head_are_closed_at_the_header_timeout(
    port: int,
) -> None:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    for i, sock in enumerate(socks):
        sock.settimeout(HEADER_TIMEOUT_S + 10)
        if i % 2:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # a request line, then nothing
    start = time.monotonic()
    answers = [_answer(sock) for sock in socks]  # each returns when the server closes
    took = time.monotonic() - start
    for sock in socks:
        sock.close()
    assert took < HEADER_TIMEOUT_S + 2
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"content-type: application/json" in head
        assert "header_timeout_s" in json.loads(body)["detail"]


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",  # a NUL in a header
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ],
)
def test_requests_that_are_not_http_get_a_json_400(port: int, head: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        answer = _answer(sock)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 ") and b"application/json" in status
    assert json.loads(body)["detail"].startswith("the request is not valid HTTP/1.1")


def test_maximal_requests_are_refused_at_once_and_a_small_one_is_served(port: int) -> None:
    url = f"http://127.0.0.1:{port}/generate"
    maximal = {"num_cells": 256, "steps": 1000}  # the largest the default limits allow

    async def load() -> tuple[list[httpx.Response], httpx.Response, float]:
        async with httpx.AsyncClient(timeout=120) as client:
            big = [asyncio.ensure_future(client.post(url, json={**maximal, "seed": i}))
                   for i in range(9)]  # fmt: skip
            await asyncio.sleep(0.2)
            start = time.monotonic()
            small = await client.post(url, json={"num_cells": 1, "steps": 10, "timeout_s": 60})
            return await asyncio.gather(*big), small, time.monotonic() - start

    big, small, took = asyncio.run(load())
    for response in big:
        assert response.status_code == 422, response.text
        [error] = response.json()["detail"]
        assert error["type"] == "too_costly" and error["ctx"]["deadline_s"] == 600
        assert error["ctx"]["estimated_s"] > 600
        assert error["msg"].startswith("this request needs about")
    assert small.status_code == 200 and len(small.json()["counts"]) == 1
    assert took < 60
