"""Real uvicorn (``sedd serve``) against hostile clients (issue 32): a client that drips a body
after an early answer is closed instead of holding a connection slot, Content-Length with
Transfer-Encoding is a JSON 400 that closes the connection, only the connections past the cap are
refused (JSON, Retry-After), a WebSocket upgrade is answered in JSON, and a client that hangs up
mid-upload is counted as cancelled and logged in one line."""

from __future__ import annotations

import asyncio
import json
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_client import free_port, server_env, uvicorn_in_thread

from server.http.protocol import BODY_GRACE_S, LINGER_S, TimedH11Protocol

# a real `sedd serve` (uvicorn) in a subprocess: CI's slow step, not the README's command
pytestmark = pytest.mark.slow

KEY = "overload-key"
CAP = 16
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 4.0
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()


class Server:
    """A running ``sedd serve`` and the file its log goes to."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def log_size(self) -> int:
        return self.log.stat().st_size

    def log_since(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace")


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("overload") / "serve.log"
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--port", str(port), "--precision", "fp32",
            "--device", "cpu", "--header-timeout-s", str(HEADER_TIMEOUT_S),
            "--body-timeout-s", str(BODY_TIMEOUT_S), "--max-connections", str(CAP)]  # fmt: skip
    env = server_env(SEDD_API_KEY=KEY)
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not _healthy(port):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    yield Server(port, log)
    proc.terminate()
    proc.wait(30)


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response (head, body) by its Content-Length; (b"", b"") at a close before any."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
    length = int(match.group(1)) if match else 0
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head, body


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _is_json(head: bytes, body: bytes) -> bool:
    return b"content-type: application/json" in head.lower() and "detail" in json.loads(body)


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (its response already read)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(4096) == b""
    except OSError:
        return True


def _wait_for_free_slots(server: Server) -> None:
    """The previous test's connections are closed server-side: a fresh one is admitted."""
    deadline = time.monotonic() + 10
    while not _healthy(server.port):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _head(line: bytes, length: int, key: bool = True) -> bytes:
    auth = AUTH if key else b""
    return line + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % length


EARLY_ANSWERS = [  # (head, the status it is answered with before its body is read)
    (_head(b"POST /generate", 100_000, key=False), b"401"),
    (_head(b"POST /nowhere", 100_000), b"404"),
    (_head(b"PUT /generate", 100_000), b"405"),
    (_head(b"POST /generate", 999_999_999), b"413"),
]


def test_body_drips_after_an_early_answer_are_closed_and_other_clients_served(
    server: Server,
) -> None:
    _wait_for_free_slots(server)
    drips, answers = [], []
    for i in range(CAP):  # each answered before its body, then sent one more byte now and then
        head, status = EARLY_ANSWERS[i % len(EARLY_ANSWERS)]
        drips.append(server.connect())
        drips[-1].sendall(head + b"{")
        answers.append((status, *_read_response(drips[-1])))
    answered = time.monotonic()
    closed_after: dict[int, float] = {}
    served_in: float | None = None
    while time.monotonic() - answered < HEADER_TIMEOUT_S + BODY_TIMEOUT_S:
        for i, sock in enumerate(drips):  # one body byte each, far faster than any timeout
            if i not in closed_after:
                try:
                    sock.send(b" ")
                except OSError:
                    closed_after[i] = time.monotonic() - answered
        for i, sock in enumerate(drips):
            if i not in closed_after and _closed(sock):
                closed_after[i] = time.monotonic() - answered
        if served_in is None and time.monotonic() - answered > 0.5:
            start = time.monotonic()
            with server.connect(timeout=HEADER_TIMEOUT_S) as client:
                client.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
                head, body = _read_response(client)
            assert head.startswith(b"HTTP/1.1 200 "), head + body
            served_in = time.monotonic() - start
        time.sleep(0.25)
    for sock in drips:
        sock.close()
    assert served_in is not None and served_in < HEADER_TIMEOUT_S
    assert len(closed_after) == CAP, f"{CAP - len(closed_after)} drip connection(s) still open"
    assert max(closed_after.values()) < LINGER_S + 1
    for status, head, body in answers:
        assert head.startswith(b"HTTP/1.1 " + status + b" ") and _is_json(head, body), head


def test_content_length_with_transfer_encoding_is_a_json_400_that_closes(server: Server) -> None:
    _wait_for_free_slots(server)
    smuggled = (b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")  # fmt: skip
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with server.connect(timeout=HEADER_TIMEOUT_S + 5) as sock:
        sock.sendall(smuggled + pipelined)
        start = time.monotonic()
        answer = _read_all(sock)
        took = time.monotonic() - start
    head, _, body = answer.partition(b"\r\n\r\n")
    assert len(re.findall(rb"HTTP/1\.1 \d{3} ", answer)) == 1, answer  # the pipelined one: not run
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head.lower()
    assert _is_json(head, body)
    assert "Content-Length and Transfer-Encoding" in json.loads(body)["detail"]
    assert took < 3.0


def test_only_the_connections_past_the_cap_are_refused(server: Server) -> None:
    _wait_for_free_slots(server)
    time.sleep(0.5)
    excess = 4
    socks = [server.connect() for _ in range(CAP + excess)]
    time.sleep(0.5)  # all accepted before any request
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answers = [_read_response(sock) for sock in socks]
    for sock in socks:
        sock.close()
    refused = [(head, body) for head, body in answers if not head.startswith(b"HTTP/1.1 200 ")]
    assert len(refused) == excess, [head.split(b"\r\n")[0] for head, _ in answers]
    for head, body in refused:
        assert head.startswith(b"HTTP/1.1 503 ") and _is_json(head, body), head + body
        assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower()
        assert "max_connections" in json.loads(body)["detail"]


@pytest.mark.parametrize(("path", "status"), [(b"/healthz", b"200"), (b"/socket", b"404")])
def test_a_websocket_upgrade_is_answered_in_json(
    server: Server, path: bytes, status: bytes
) -> None:
    _wait_for_free_slots(server)
    upgrade = (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Connection: Upgrade\r\n"
               b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")  # fmt: skip
    with server.connect() as sock:
        sock.sendall(upgrade)
        head, body = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 " + status + b" "), head + body
    assert b"content-type: application/json" in head.lower()
    json.loads(body)


def _requests_total(server: Server, outcome: str) -> float:
    with server.connect() as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Connection: close\r\n\r\n")
        text = _read_all(sock).decode()
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        labels = (f'outcome="{outcome}"', 'route="/generate"')
        if name.startswith("sedd_requests_total{") and all(label in name for label in labels):
            return float(value)
    return 0.0


def test_a_client_that_hangs_up_mid_upload_is_cancelled_and_logged_once(server: Server) -> None:
    _wait_for_free_slots(server)
    cancelled, errors = _requests_total(server, "cancelled"), _requests_total(server, "error")
    offset = server.log_size()
    with server.connect() as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 1000\r\n"
                     b"Content-Type: application/json\r\n\r\n" + b'{"num_cells": 1')  # fmt: skip
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while _requests_total(server, "cancelled") == cancelled and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # anything else it would log
    log = server.log_since(offset)
    assert _requests_total(server, "cancelled") == cancelled + 1
    assert _requests_total(server, "error") == errors
    assert "Traceback" not in log, log
    [line] = [line for line in log.splitlines() if "hung up" in line]
    assert "/generate" in line


async def _never_reads(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that neither reads a request's body nor answers it."""
    if scope["type"] == "http":
        await asyncio.sleep(3600)


def test_a_body_nothing_reads_is_cut_at_the_body_deadline() -> None:
    port, body_timeout_s = free_port(), 1.0
    protocol = TimedH11Protocol.configured(
        header_timeout_s=1.0, body_timeout_s=body_timeout_s, max_connections=4
    )
    with (
        uvicorn_in_thread(_never_reads, protocol, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        start = time.monotonic()
        sock.sendall(_head(b"POST /anything", 100_000))
        answer = _drip_until_closed(sock, seconds=10)
        took = time.monotonic() - start
    assert body_timeout_s + BODY_GRACE_S - 0.5 < took < body_timeout_s + BODY_GRACE_S + LINGER_S + 1
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and _is_json(head, body), answer
    assert "body_timeout_s=1 s" in json.loads(body)["detail"]


def _drip_until_closed(sock: socket.socket, seconds: float) -> bytes:
    """Send a body byte every 0.3 s until the server closes; what it sent meanwhile."""
    answer, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not select.select([sock], [], [], 0.3)[0]:
                sock.send(b" ")
            elif chunk := sock.recv(4096):
                answer += chunk
            else:
                break
        except OSError:
            break
    return answer
