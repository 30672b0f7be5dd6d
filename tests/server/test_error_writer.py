"""Every error body the service sends is written by one module, ``server.http.errors``.

Statically: exactly one module of ``server/`` builds a ``{"detail": ...}`` object. Behaviourally:
the connection protocol's raw 400 and 408, the guard's 401 and 503, the app's HTTP exceptions,
validation errors and mapped domain errors, and the errors Ray's proxy writes all send the same
bytes for the same detail: compact JSON ``{"detail": ...}`` as ``application/json``; and an SSE
``error`` event (the app's, or the one Ray's proxy ends a lost stream with) is ``{"status",
"detail"}``, the stream's documented ``ErrorEvent``.
"""

from __future__ import annotations

import ast
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from server_client import free_port, uvicorn_in_thread

from server.app import create_app
from server.config import Settings
from server.events import ErrorEvent
from server.http.errors import error_bytes, error_event
from server.http.guard import GuardMiddleware
from server.http.protocol import TimedH11Protocol
from server.ray.proxy_errors import JsonProxyErrors

ROOT = Path(__file__).resolve().parents[2]
WRITER = "server/http/errors.py"


def _builds_detail_body(tree: ast.AST) -> bool:
    """Whether the code builds an object keyed ``"detail"``: a dict display with that key, or
    ``dict(detail=...)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value == "detail" for key in node.keys
        ):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
            and any(keyword.arg == "detail" for keyword in node.keywords)
        ):
            return True
    return False


def test_exactly_one_server_module_writes_an_error_body() -> None:
    writers = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "server").rglob("*.py")
        if _builds_detail_body(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    )
    assert writers == [WRITER], f"modules that build a 'detail' error body: {writers}"


def _the_one_shape(content_type: str | None, body: bytes) -> Any:
    """The body's detail, after checking the body is exactly what the writer writes for it."""
    assert content_type == "application/json", (content_type, body)
    parsed = json.loads(body)
    assert isinstance(parsed, dict) and set(parsed) == {"detail"}, body
    detail = parsed["detail"]
    is_errors = isinstance(detail, list) and all(isinstance(item, dict) for item in detail)
    assert isinstance(detail, str) or is_errors, body
    assert body == error_bytes(detail), "not the one writer's bytes"
    return detail


# The app (no model loaded) and its guard, over ASGI


def _app(**overrides: Any) -> Any:
    app = create_app(Settings(**overrides))
    app.state.service = SimpleNamespace(draining=False)  # past the dependencies; never run
    app.state.host = SimpleNamespace()
    return app


async def _ask(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sedd") as client:
        return await client.request(method, path, **kwargs)


@pytest.mark.anyio
async def test_the_app_and_its_guard_answer_in_the_one_shape() -> None:
    answers = {
        "HTTPException 404": await _ask(_app(), "GET", "/nowhere"),
        "HTTPException 405": await _ask(_app(), "DELETE", "/generate"),
        "validation 422": await _ask(_app(), "POST", "/generate", json={"conditon": 1}),
        "strict JSON 422": await _ask(_app(), "POST", "/generate", content=b'{"a": 1, "a": 2}'),
        "too large 413": await _ask(
            _app(max_body_bytes=1024), "POST", "/generate", content=b"[" + b"1," * 600 + b"1]"
        ),
        "guard 401": await _ask(_app(api_key="k" * 32), "GET", "/v1/models"),
    }
    draining = _app()
    draining.state.draining = True
    answers["guard 503"] = await _ask(draining, "GET", "/v1/models")
    expected = {
        "HTTPException 404": 404,
        "HTTPException 405": 405,
        "validation 422": 422,
        "strict JSON 422": 422,
        "too large 413": 413,
        "guard 401": 401,
        "guard 503": 503,
    }
    assert {name: answer.status_code for name, answer in answers.items()} == expected
    for name, answer in answers.items():
        detail = _the_one_shape(answer.headers.get("content-type"), answer.content)
        assert detail, name
    assert isinstance(_the_one_shape("application/json", answers["validation 422"].content), list)
    assert answers["guard 503"].headers["retry-after"] == "5"
    assert answers["guard 401"].headers["www-authenticate"] == "Bearer"


@pytest.mark.anyio
async def test_the_guard_alone_answers_in_the_one_shape() -> None:
    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the guard should have answered")

    state = SimpleNamespace(settings=SimpleNamespace(api_key=None), draining=True)
    answer = await _ask(GuardMiddleware(never, state), "GET", "/anything")
    assert answer.status_code == 503
    _the_one_shape(answer.headers.get("content-type"), answer.content)


# The connection protocol, over a real socket


async def _unread(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app the protocol's own answers never reach."""
    raise AssertionError("the protocol should have answered")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    protocol = TimedH11Protocol.configured(
        header_timeout_s=0.5, body_timeout_s=5.0, max_connections=4
    )
    with uvicorn_in_thread(_unread, protocol, free_port()) as port:
        yield port


def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """(head, body) of the one response the server sends to ``request`` before it closes."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def _content_type(head: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-type":
            return value.strip().decode()
    return None


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
         b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", b"408"),  # the head never completes
    ],
)  # fmt: skip
def test_the_connection_protocol_answers_in_the_one_shape(
    port: int, request_bytes: bytes, status: bytes
) -> None:
    head, body = _raw(port, request_bytes)
    assert head.split(b" ")[1] == status, head
    _the_one_shape(_content_type(head), body)


# Ray's proxy (the middleware alone; no Ray needed)


async def _through_proxy(app: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await JsonProxyErrors(app)({"type": "http"}, None, send)
    return sent


@pytest.mark.anyio
async def test_ray_proxy_errors_answer_in_the_one_shape() -> None:
    async def dead(scope: Any, receive: Any, send: Any) -> None:
        return  # a replica that died: the proxy sends nothing

    async def plain(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    for app in (dead, plain):
        start, *bodies = await _through_proxy(app)
        headers = {bytes(k): bytes(v) for k, v in start["headers"]}
        assert start["status"] == 503
        body = b"".join(message.get("body", b"") for message in bodies)
        _the_one_shape(headers[b"content-type"].decode(), body)


@pytest.mark.anyio
async def test_sse_error_events_carry_the_stream_s_error_event() -> None:
    async def lost(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"event: queued\n", "more_body": True})
        raise RuntimeError("the replica died")

    *_, last = await _through_proxy(lost)
    event, data = last["body"].decode().strip().split("\n")
    assert event == "event: error" and data.startswith("data: ")
    sent = json.loads(data.removeprefix("data: "))
    assert set(sent) == set(ErrorEvent.model_fields) == set(error_event(503, "x"))
    assert sent == error_event(503, sent["detail"]) and ErrorEvent.model_validate(sent)
