"""Clients that never read (issue "Hardening, round 5", item 1), on real uvicorn with the
service's connection protocol (``server.http.protocol``).

Connections that pipelined requests and never read the answers kept their places under the
connection cap for as long as they stayed open (legitimate clients got 503 for 240 s), and an
unauthenticated client could hold one by sending request after request answered 401. Now a
connection whose answers are not read is closed once writing has stayed paused
``write_timeout_s``, and a 401 closes its connection."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
from server_client import free_port, make_settings, uvicorn_in_thread

from sedd.defaults import DEFAULT_MODEL
from server.app import create_app
from server.http.protocol import TimedH11Protocol

ANSWER = b"x" * 65536  # each answer: 64 KiB, so a client that reads none fills its buffers fast


async def _big_answers(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(ANSWER)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": ANSWER})


def _pipeline(port: int, requests: int, head: bytes = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"):
    """A client that sends ``requests`` pipelined requests and reads nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    data = head * requests
    while data:  # as much as the server takes in
        try:
            data = data[sock.send(data) :]
        except BlockingIOError:
            break
    return sock


def test_a_client_that_reads_none_of_its_answers_is_closed_and_its_place_freed() -> None:
    port, write_timeout_s = free_port(), 1.0
    protocol = TimedH11Protocol.configured(
        header_timeout_s=30.0, body_timeout_s=30.0, max_connections=1,
        write_timeout_s=write_timeout_s,
    )  # fmt: skip
    with uvicorn_in_thread(_big_answers, protocol, port):
        start = time.monotonic()
        reader = _pipeline(port, 2000)  # the one place under the cap
        time.sleep(0.5)
        blocked = httpx.get(f"http://127.0.0.1:{port}/x", timeout=10)
        while protocol.admitted and time.monotonic() - start < 20:
            time.sleep(0.1)
        closed_after = time.monotonic() - start
        served = httpx.get(f"http://127.0.0.1:{port}/x", timeout=10)
        reader.close()
    assert blocked.status_code == 503  # the place was held while it was not reading
    assert not protocol.admitted  # the non-reader's place was freed ...
    assert closed_after < write_timeout_s + 10, closed_after  # ... after the write timeout
    assert served.status_code == 200 and served.content == ANSWER


def test_a_401_closes_its_connection() -> None:
    """A pipelined run of requests without the key gets one 401, then the connection ends."""
    port = free_port()
    app = create_app(make_settings(DEFAULT_MODEL, api_key="s3cret"))
    protocol = TimedH11Protocol.configured(
        header_timeout_s=5.0, body_timeout_s=5.0, max_connections=4
    )
    head = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"
    with (
        uvicorn_in_thread(app, protocol, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(head * 50)
        answer = b""
        while chunk := sock.recv(65536):  # until the server closes
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.count(b"HTTP/1.1 ") == 1, answer[:500]
    assert b"connection: close" in answer.lower()
