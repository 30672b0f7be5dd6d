"""JSON for the errors Ray Serve's HTTP proxy writes itself (``sedd serve --replicas``).

Every error our app returns is JSON. Behind Ray Serve, a few come from Ray's proxy instead, as
plain text or as nothing at all: a replica that died with the request on it (the proxy sends no
response, and the server writes a bare 500), Ray's back-pressure when every replica's queue is
full (503), and Ray's own shutdown or an application that is not running (503).
``proxy_middlewares`` (named by ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, which
``server.ray.replicas`` sets before Ray starts) wraps the proxy so that back-pressure becomes our
JSON 429 with ``Retry-After``, and every other such failure a JSON 503 with ``Retry-After`` that
says to retry: the request did not finish, and another replica (or the restarted one) will take
it. A ``.../stream`` response whose replica dies after its events began cannot change its status:
it ends with an ``error`` event (JSON data, status 503, a detail that says to retry) instead of a
cut-off body. Every body is written by ``server.http.errors``, as the app's own are.

Ray's proxy also answers routes of its own, which never reach a replica and so never pass the
app's key check: ``/-/routes`` (the route prefixes served) and ``/-/healthz``. With a key
(``SEDD_API_KEY`` in the proxy's environment, which ``server.ray.replicas`` sets before it starts
a local Ray), ``RayRoutesKey`` asks for it on every such route but ``/-/healthz``, a liveness
probe like the app's ``/healthz``, which needs none either. This module imports nothing heavy: it
runs in the proxy's process.
"""

from __future__ import annotations

import json
import os

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.errors import error_event, send_error
from server.http.guard import key_problem, refuse

IMPORT_PATH = "server.ray.proxy_errors.proxy_middlewares"
RETRY_AFTER_S = 1
FAILED = (
    "the replica serving this request stopped before it finished, or the service is starting "
    "or shutting down; nothing was returned: retry the request"
)
STREAM_LOST = (
    "the replica serving this stream stopped before the job finished (it was lost); its result "
    "will not come: retry the request"
)
FULL = "every replica's request queue is full (max_queued_jobs); retry after {s} s."
RAYS_ROUTES = "/-/"  # the prefix of the routes Ray's proxy answers itself
OPEN_RAY_ROUTES = frozenset({"/-/healthz"})  # a liveness probe carries no key


def proxy_middlewares() -> list[Middleware]:
    """What Ray's proxy calls at start-up, before it builds its HTTP server: the middlewares it
    wraps itself in (the last, ``ModelHeader``, routes a body's ``"model"`` to a replica that
    holds it: ``server.ray.model_routing``). Its connections get one process's protections here
    too (``server.ray.proxy_http``)."""
    from server.ray import proxy_http
    from server.ray.model_routing import ModelHeader

    if proxy_http.in_rays_proxy():  # never in a process of ours (e.g. a test's)
        proxy_http.install()
    return [Middleware(RayRoutesKey), Middleware(JsonProxyErrors), Middleware(ModelHeader)]


class RayRoutesKey:
    """ASGI middleware: Ray's own routes (``/-/...``) but ``/-/healthz`` need the API key, as
    every route of the app does; the key is read from ``SEDD_API_KEY`` when the proxy starts."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        self.app = app
        key = os.environ.get("SEDD_API_KEY") if key is None else key
        self.key = key.encode("utf-8") if key else None  # empty is refused before Ray starts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.key is not None and path.startswith(RAYS_ROUTES) and path not in OPEN_RAY_ROUTES:
            problem = key_problem(scope, self.key)
            if problem is not None:
                await refuse(send, problem)
                return
        await self.app(scope, receive, send)


class JsonProxyErrors:
    """ASGI middleware: a 5xx that is not our app's JSON (or no response at all) becomes JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        held: Message | None = None  # the proxy's own error: its start, until its body is in
        body = b""
        stream = _Stream()

        async def checked(message: Message) -> None:
            nonlocal started, held, body
            if message["type"] == "http.response.start":
                started = True
                if _proxy_error(message):
                    held = message
                    return
            if held is not None:  # the proxy's error body: read it, then answer for it
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    await _answer(send, *_translate(held, body))
                return
            stream.saw(message)
            await send(message)

        try:
            await self.app(scope, receive, checked)
        except Exception:
            if stream.open:  # a replica that died mid-stream (Ray may raise or just stop)
                await _end_stream(send)
                return
            if started:
                raise
            await _answer(send, 503, FAILED, RETRY_AFTER_S)
            return
        if stream.open:
            await _end_stream(send)
        elif not started:  # Ray's proxy sends nothing for a replica that died
            await _answer(send, 503, FAILED, RETRY_AFTER_S)


class _Stream:
    """Whether a response passed through is an SSE stream still open (its end not yet sent)."""

    def __init__(self) -> None:
        self.open = False

    def saw(self, message: Message) -> None:
        """Follow one message of the response on its way to the client."""
        if message["type"] == "http.response.start":
            kind = _headers(message).get(b"content-type", b"").split(b";")[0].strip()
            self.open = kind == b"text/event-stream"
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.open = False


async def _end_stream(send: Send) -> None:
    """End an SSE stream that its replica left unfinished with an ``error`` event (the app's
    own ``ErrorEvent``: status and detail), so the client reads why instead of a cut body."""
    data = json.dumps(error_event(503, STREAM_LOST), separators=(",", ":"))
    event = f"event: error\ndata: {data}\n\n".encode()
    await send({"type": "http.response.body", "body": event, "more_body": False})


def _proxy_error(start: Message) -> bool:
    if start["status"] < 500:
        return False
    kind = _headers(start).get(b"content-type", b"").split(b";")[0].strip()
    return kind not in (b"application/json", b"text/event-stream")


def _headers(start: Message) -> dict[bytes, bytes]:
    return {bytes(k).lower(): bytes(v) for k, v in start.get("headers", [])}


def _translate(start: Message, body: bytes) -> tuple[int, str, int]:
    """(status, detail, Retry-After seconds) for the proxy's error response."""
    text = body.decode(errors="replace").lower()
    if start["status"] == 503 and ("back pressure" in text or "backpressure" in text):
        after = _headers(start).get(b"retry-after", b"")
        seconds = max(RETRY_AFTER_S, int(after)) if after.isdigit() else RETRY_AFTER_S
        return 429, FULL.format(s=seconds), seconds
    return 503, FAILED, RETRY_AFTER_S


async def _answer(send: Send, status: int, detail: str, retry_after: int) -> None:
    await send_error(send, status, detail, {"Retry-After": str(retry_after)})
