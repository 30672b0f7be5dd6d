"""The gate every HTTP request passes before routing: the API key, the drain, the in-flight count.

``GuardMiddleware`` is plain ASGI and runs before anything reads the body, so:

* with ``SEDD_API_KEY`` set, every path but ``/healthz`` needs ``Authorization: Bearer <key>``,
  the key compared as UTF-8 bytes (an empty ``SEDD_API_KEY`` is refused at start-up)
  (``/docs``, ``/redoc`` and ``/openapi.json`` included: the schema lists the model's genes and
  labels); a request without it is answered 401 before its body is read or parsed;
* once the server drains (SIGTERM, ``server.serve``), new requests get a JSON 503 with
  ``Retry-After`` on the still-open listener, while the requests already in flight finish;
* ``in_flight`` counts the requests being answered (probes and metrics scrapes excluded), which
  is what the drain waits for.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import DRAINING_DETAIL, RETRY_DRAINING_S, send_error

OPEN_PATHS = frozenset({"/healthz"})  # liveness probes carry no key
UNCOUNTED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # never waited for


def _bearer(scope: Scope) -> bytes | None:
    """The bearer token's bytes as sent (a key is compared as UTF-8 bytes, whatever the client's
    header encoding); None without one, or with an empty one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            token = token.strip()
            return token if scheme.lower() == b"bearer" and token else None
    return None


def key_problem(scope: Scope, key: bytes) -> str | None:
    """Why ``scope``'s request may not pass a gate with ``key`` (UTF-8 bytes); None if it may."""
    given = _bearer(scope)
    if given is None:
        return "missing bearer API key: send `Authorization: Bearer <key>`."
    if not secrets.compare_digest(given, key):
        return "invalid API key."
    return None


async def refuse(send: Send, problem: str) -> None:
    """The 401 for ``problem``, closed after it: an unauthenticated client keeps no connection
    (and no place under max_connections) by sending request after request on it."""
    headers = {"WWW-Authenticate": "Bearer", "Connection": "close"}
    await send_error(send, 401, problem, headers)


class GuardMiddleware:
    """API key, drain gate and in-flight count (see the module docstring)."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app, self.state = app, state
        state.in_flight = 0

    def _key_problem(self, scope: Scope) -> str | None:
        key = self.state.settings.api_key
        if key is None or scope["path"] in OPEN_PATHS:
            return None
        return key_problem(scope, key.get_secret_value().encode("utf-8"))

    def _draining(self) -> bool:
        service = getattr(self.state, "service", None)
        return bool(getattr(self.state, "draining", False)) or (
            service is not None and service.draining
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._key_problem(scope)
        if problem is not None:
            await refuse(send, problem)
            return
        counted = scope["path"] not in UNCOUNTED_PATHS
        if counted and self._draining():
            await send_error(send, 503, DRAINING_DETAIL, {"Retry-After": str(RETRY_DRAINING_S)})
            return
        self.state.in_flight += counted
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= counted
