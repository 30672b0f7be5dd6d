"""Model multiplexing across Ray replicas (``sedd serve --replicas N --models DIR``).

Ray Serve routes a request to a replica that already holds its model when the request carries
the header ``serve_multiplexed_model_id`` and the replicas load models through a
``@serve.multiplexed`` method (``server.ray.replicas``): each replica tells Ray's router which
models it holds, and Ray's LRU (``max_num_models_per_replica`` = ``max_loaded_models``) decides
which one a replica gives up. Our clients send the model as ``"model"`` in the JSON body,
OpenAI-style, not as a header, so ``ModelHeader`` (a middleware of Ray's proxy) reads it there:
for a POST to a sampling route that has no such header, it reads the body (at most
``max_body_bytes``; a larger one passes on untouched, for the replica's 413), takes its
``"model"`` when the body is a JSON object that has one, adds the header, and hands the same
bytes on. A request without ``"model"`` gets no header: every replica holds the default model.
With an API key set, a request without the right key is passed on unread (the replica answers
its 401), so no one without the key makes the proxy read a body.
"""

from __future__ import annotations

import json
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.guard import key_problem

HEADER = b"serve_multiplexed_model_id"  # Ray Serve's, matched with "_" or "-"
ROUTES = frozenset(
    f"/{name}{suffix}" for name in ("generate", "predict", "impute") for suffix in ("", "/stream")
)
DEFAULT_BODY_BYTES = 4 * 2**20  # server.config.Settings.max_body_bytes's default


def model_of(body: bytes) -> str | None:
    """The ``"model"`` of a JSON object body, if it is a non-empty string; else None."""
    if b'"model"' not in body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # not JSON: the replica answers its 422
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) and model else None


class ModelHeader:
    """ASGI middleware of Ray's proxy: the body's ``"model"`` as Ray's multiplexing header (see
    the module docstring). Reads ``SEDD_MAX_BODY_BYTES`` and ``SEDD_API_KEY`` at start-up."""

    def __init__(self, app: ASGIApp, key: str | None = None, max_body_bytes: int | None = None):
        self.app = app
        key = os.environ.get("SEDD_API_KEY") if key is None else key
        self.key = key.encode("utf-8") if key else None
        limit = os.environ.get("SEDD_MAX_BODY_BYTES") if max_body_bytes is None else max_body_bytes
        self.max_body_bytes = int(limit) if limit else DEFAULT_BODY_BYTES

    def _wanted(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return False
        if scope.get("path") not in ROUTES:
            return False
        names = {k.lower().replace(b"-", b"_") for k, _ in scope.get("headers", [])}
        if HEADER in names:
            return False  # the client named the model itself
        return self.key is None or key_problem(scope, self.key) is None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._wanted(scope):
            await self.app(scope, receive, send)
            return
        held: list[Message] = []
        size, more = 0, True
        while more and size <= self.max_body_bytes:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break  # the client went away: pass that on as it came
            size += len(message.get("body", b""))
            more = bool(message.get("more_body", False))
        if not more and size <= self.max_body_bytes:
            body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.request")
            model = model_of(body)
            if model is not None:
                headers = [*scope.get("headers", []), (HEADER, model.encode("utf-8"))]
                scope = {**scope, "headers": headers}

        async def replay() -> Message:
            if held:
                return held.pop(0)
            return await receive()

        await self.app(scope, replay, send)
