"""The service's gate and strict input: the API key covers every route but /healthz and is
checked before the body is read; request bodies are strict JSON and strict types; stalled uploads
are dropped; a stream whose client leaves is counted as cancelled."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from server_client import make_settings, served, slow_down
from server_models import save_tiny_model

from server.app import create_app

KEY = "s3cret-key"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("hardening") / "tiny")


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/redoc", "/docs/oauth2-redirect"])
async def test_docs_and_schema_need_the_key(model_dir: Path, path: str) -> None:
    async with served(make_settings(model_dir, api_key=KEY)) as (client, _):
        anonymous = await client.get(path)
        wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
        keyed = await client.get(path, headers={"Authorization": f"Bearer {KEY}"})
        health = await client.get("/healthz")
    assert anonymous.status_code == wrong.status_code == 401
    assert anonymous.json() == {
        "detail": "missing bearer API key: send `Authorization: Bearer <key>`."
    }
    assert wrong.json() == {"detail": "invalid API key."}
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert "ctrl" not in anonymous.text  # no label or gene name leaks
    assert keyed.status_code == 200 and health.status_code == 200


async def test_the_key_is_checked_before_the_body_is_read(model_dir: Path) -> None:
    app = create_app(make_settings(model_dir, api_key=KEY))
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"{" * 10_000}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = _scope("/generate", [(b"content-type", b"application/json")])
    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 401 and reads == 0
    assert json.loads(sent[1]["body"])["detail"].startswith("missing bearer API key")


@pytest.mark.parametrize(
    ("body", "loc", "message"),
    [
        ('{"num_cells": "2"}', ["body", "num_cells"], "Input should be a valid integer"),
        ('{"num_cells": true}', ["body", "num_cells"], "Input should be a valid integer"),
        ('{"num_cells": 1, "seed": 2.0}', ["body", "seed"], "Input should be a valid integer"),
        ('{"num_cells": 1, "num_cells": 2}', ["body", "num_cells"], "duplicate key 'num_cells'"),
        ('{"condition": "\\ud800"}', ["body", "condition"], "lone UTF-16 surrogate"),
        ('{"seed": ' + "9" * 5000 + "}", ["body", "seed"], "an integer with 5000 digits"),
        ('{"seed": ' + "1" * 41 + "}", ["body", "seed"], "an integer with 41 digits"),
        ('{"temperature": NaN}', ["body", "temperature"], "NaN is not JSON"),
        ('{"temperature": Infinity}', ["body", "temperature"], "Infinity is not JSON"),
        ('{"temperature": 1e999}', ["body", "temperature"], "1e999 overflows a float"),
        ('{"genes": ["A"], "counts": [[NaN]]}', ["body", "counts", 0, 0], "NaN is not JSON"),
        ("[" * 100_000 + "]" * 100_000, ["body"], "nested deeper than 32 levels"),
        ('{"a": ' * 40 + "1" + "}" * 40, ["body", *["a"] * 33], "nested deeper than 32"),
    ],
)
async def test_bad_bodies_are_422s_naming_the_field(
    model_dir: Path, body: str, loc: list[Any], message: str
) -> None:
    settings = make_settings(model_dir, max_body_bytes=1_000_000)
    async with served(settings) as (client, _):
        response = await client.post(
            "/generate", content=body.encode(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == loc
    assert message in error["msg"]


async def test_invalid_utf8_is_a_422_naming_the_byte(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post(
            "/generate",
            content=b'{"condition": "\xff"}',
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", 15]
    assert error["msg"].startswith("the body is not UTF-8 (byte 0xff at position 15)")


async def test_a_stalled_upload_is_dropped_with_408(model_dir: Path) -> None:
    app = create_app(make_settings(model_dir, body_timeout_s=0.2))

    async def receive() -> dict[str, Any]:  # the first chunk, then nothing more
        if not receive.sent:  # type: ignore[attr-defined]
            receive.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b'{"num_cells"', "more_body": True}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    receive.sent = False  # type: ignore[attr-defined]
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        scope = _scope("/generate", [(b"content-type", b"application/json")])
        await asyncio.wait_for(app(scope, receive, send), timeout=5)
    assert sent[0]["status"] == 408
    assert "body_timeout_s=0.2 s" in json.loads(sent[1]["body"])["detail"]


async def test_a_stream_whose_client_leaves_counts_as_cancelled(model_dir: Path) -> None:
    app = create_app(make_settings(model_dir))
    body = json.dumps({"num_cells": 2, "steps": 20}).encode()
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:  # like uvicorn's: disconnect once it happened
        if messages:
            return messages.pop()
        while not any(b"event: progress" in m.get("body", b"") for m in sent):
            await asyncio.sleep(0.01)  # hang up once the first progress event arrived
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        slow_down(app.state.service, 0.05)
        scope = _scope("/generate/stream", [(b"content-type", b"application/json")])
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
        metrics = app.state.metrics.render().decode()
    assert sent[0]["status"] == 200  # the stream had started
    cancelled = 'sedd_requests_total{model="tiny",outcome="cancelled",route="/generate/stream"} 1.0'
    assert cancelled in metrics
    assert 'outcome="ok",route="/generate/stream"' not in metrics


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"host", b"sedd.test")],
        "client": ("127.0.0.1", 1),
        "server": ("sedd.test", 80),
    }


async def test_docs_load_their_assets_from_the_server_not_a_cdn(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        pages = [await client.get(path) for path in ("/docs", "/redoc")]
        assets = re.findall(
            r'(?:src|href)="([^"]+\.(?:js|css|png))"', pages[0].text + pages[1].text
        )
        fetched = [await client.get(url) for url in assets]
    assert all(page.status_code == 200 for page in pages)
    assert not any(re.search(r"https?://", page.text) for page in pages)  # no CDN, no fonts
    assert {Path(url).name for url in assets} >= {"swagger-ui-bundle.js", "swagger-ui.css"}
    assert all(url.startswith("/") for url in assets)  # same origin
    assert all(r.status_code == 200 and len(r.content) > 1000 for r in fetched)
