"""``server.ray.model_routing.ModelHeader``: Ray's proxy routes a body's ``"model"`` to a replica
that holds it, by Ray's multiplexing header, and hands the body on byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.ray.model_routing import HEADER, ModelHeader, model_of

pytestmark = pytest.mark.anyio
KEY = "routing-key-0123"


class Downstream:
    """Ray's proxy app past the middleware: what scope and body it got."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.headers = list(scope["headers"])
        more = True
        while more:
            message = await receive()
            self.body += message.get("body", b"")
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def _through(
    body: bytes,
    *,
    path: str = "/generate",
    headers: list[tuple[bytes, bytes]] | None = None,
    chunk: int = 7,
    **options: Any,
) -> Downstream:
    app = Downstream()
    middleware = ModelHeader(app, **options)
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    await middleware(scope, receive, send)
    return app


def _model_header(app: Downstream) -> bytes | None:
    found = [value for name, value in app.headers if name == HEADER]
    return found[0] if found else None


async def test_the_bodys_model_becomes_rays_header_and_the_body_passes_on_unchanged() -> None:
    body = json.dumps({"num_cells": 2, "model": "beta", "steps": 3}).encode()
    app = await _through(body, key="", max_body_bytes=4096)
    assert _model_header(app) == b"beta"
    assert app.body == body  # read in 7-byte pieces, replayed whole


async def test_no_model_no_header_and_other_routes_and_large_bodies_are_not_read() -> None:
    plain = json.dumps({"num_cells": 2}).encode()
    named = json.dumps({"model": "beta", "pad": "x" * 200}).encode()
    assert _model_header(await _through(plain, key="", max_body_bytes=4096)) is None
    assert _model_header(await _through(named, path="/v1/models", key="")) is None
    large = await _through(named, key="", max_body_bytes=64)  # over the limit: the replica's 413
    assert _model_header(large) is None and large.body == named
    assert _model_header(await _through(b"not json", key="")) is None


async def test_a_client_that_names_the_model_itself_or_lacks_the_key_is_not_read() -> None:
    named = json.dumps({"model": "beta"}).encode()
    own = await _through(named, headers=[(b"serve-multiplexed-model-id", b"gamma")], key="")
    assert _model_header(own) is None  # its own header (hyphenated) stays, no second one
    assert (b"serve-multiplexed-model-id", b"gamma") in own.headers
    keyless = await _through(named, key=KEY)
    assert _model_header(keyless) is None and keyless.body == named
    keyed = await _through(named, key=KEY, headers=[(b"authorization", f"Bearer {KEY}".encode())])
    assert _model_header(keyed) == b"beta"


def test_model_of_takes_a_non_empty_string_model_of_a_json_object_only() -> None:
    assert model_of(b'{"model": "a"}') == "a"
    for body in (b'{"model": ""}', b'{"model": 3}', b'["model"]', b'{"model": "a"', b"{}"):
        assert model_of(body) is None
