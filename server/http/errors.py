"""Error bodies, written in one place: every error the service answers is ``{"detail": ...}``.

``error_body`` is the only code in ``server/`` that builds that object; everything else goes
through it, whatever layer answers:

* the app's exception handlers (``server.app``): ``error_response``, a Starlette response;
* ASGI middlewares that answer before the app (the guard's 401 and 503, Ray's proxy errors):
  ``send_error``;
* the connection protocol, which writes raw HTTP/1.1 (its 400, 408 and 503): ``raw_error``;
* the ``error`` event of an SSE stream (``{"status", "detail"}``): ``error_event``.

The bytes are the same on every path: compact UTF-8 JSON, as Starlette's ``JSONResponse``
writes it. This module also holds the errors the generic HTTP layer raises itself (a body too
large or too slow, a client that hung up, a field it refuses); ``server.errors`` maps them, with
the engine's and the library's, to a status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Send

Detail = str | list[dict[str, Any]]  # a message, or FastAPI-style validation errors
RETRY_DRAINING_S = 5  # Retry-After of a request refused while the server shuts down
DRAINING_DETAIL = "the server is shutting down and takes no new requests"
EXCERPT_CHARS = 200  # an error's ``input`` echoes at most this much of what was sent


def error_body(detail: Detail) -> dict[str, Any]:
    """THE error object: ``{"detail": detail}``."""
    return {"detail": detail}


def error_event(status: int, detail: Detail) -> dict[str, Any]:
    """The data of an SSE ``error`` event: the status and body the plain route would answer."""
    return {"status": status, **error_body(detail)}


def error_bytes(detail: Detail) -> bytes:
    """The error body as sent: compact UTF-8 JSON (what ``JSONResponse`` writes)."""
    body = error_body(detail)
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def error_response(
    status: int, detail: Detail, headers: Mapping[str, str] | None = None
) -> Response:
    """The error as a Starlette response (the app's exception handlers)."""
    return Response(error_bytes(detail), status, headers=headers, media_type="application/json")


async def send_error(
    send: Send, status: int, detail: Detail, headers: Mapping[str, str] | None = None
) -> None:
    """Answer an ASGI request with the error (middlewares that answer before the app)."""
    body = error_bytes(detail)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def raw_error(status: int, reason: str, detail: Detail, *headers: str) -> bytes:
    """A whole HTTP/1.1 response carrying the error, closing the connection (``headers`` as
    ``name: value`` lines), for the connection protocol, which writes to the socket itself."""
    body = error_bytes(detail)
    extra = "".join(f"{header}\r\n" for header in headers)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode() + body


class FieldError(ValueError):
    """A request field the model or the server's limits reject: a 422 naming ``loc``.

    The body matches FastAPI's own validation errors, ``{"detail": [{"type", "loc", "msg",
    "input", "ctx"}]}``, so a client handles both the same way.
    """

    def __init__(
        self,
        loc: Sequence[str | int],
        msg: str,
        *,
        type: str = "value_error",
        input: Any = None,
        ctx: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(msg)
        self.loc, self.msg, self.type, self.input, self.ctx = list(loc), msg, type, input, ctx

    def detail(self) -> list[dict[str, Any]]:
        item: dict[str, Any] = {"type": self.type, "loc": self.loc, "msg": self.msg}
        item["input"] = excerpt(self.input)
        if self.ctx is not None:
            item["ctx"] = self.ctx
        return [item]


def excerpt(value: Any) -> Any:
    """``value`` as an error's ``input``: as sent when its JSON is short, else the first
    ``EXCERPT_CHARS`` characters of it, marked as cut. The JSON is written lazily and stops there,
    so a large body costs nothing to refuse and is never echoed back whole."""
    text, size = [], 0
    for chunk in json.JSONEncoder(default=str).iterencode(value):
        text.append(chunk)
        size += len(chunk)
        if size > EXCERPT_CHARS:
            return "".join(text)[:EXCERPT_CHARS] + f" ... (cut at {EXCERPT_CHARS} characters)"
    return value


class BodyTooLarge(Exception):
    """The request body is larger than ``max_body_bytes`` (declared or as streamed)."""

    def __init__(self, limit: int, size: int | None) -> None:
        seen = "" if size is None else f" (got at least {size} bytes)"
        super().__init__(
            f"request body exceeds max_body_bytes={limit} bytes{seen}; send fewer cells or genes."
        )


def body_timeout_detail(timeout: float) -> str:
    """What a request whose body did not arrive in time is told (the route's 408, and the
    connection's own when nothing reads the body)."""
    return (
        f"the request body did not arrive within body_timeout_s={timeout:g} s; send it "
        "without pauses."
    )


class BodyTimeout(Exception):
    """The request body did not arrive within ``body_timeout_s``."""

    def __init__(self, timeout: float) -> None:
        super().__init__(body_timeout_detail(timeout))


class ClientDisconnected(Exception):
    """The client went away before its result was ready; its job was cancelled."""
