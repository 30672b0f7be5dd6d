"""Real uvicorn: a large body is parsed off the event loop (six 4 MB bodies once held it for
seconds: /healthz slowed to 1.56 s, and the measured forward time with it), and a 422 for one
echoes a short excerpt of what was sent, not the 3.2 MB. The /healthz latency itself is a
timing, so it is measured by ``scripts/overload_check.py --only large-bodies``, not here."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from server_client import free_port, make_settings
from server_models import save_tiny_model

import server.http.limits
from server.app import create_app
from server.http.errors import EXCERPT_CHARS


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = save_tiny_model(tmp_path_factory.mktemp("large") / "tiny")
    settings = make_settings(model, max_body_bytes=8 * 2**20)
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(30)


def _where(seen: list[bool]):
    """``parse_json_body`` that records whether it ran on a thread with an event loop."""
    parse = server.http.limits.parse_json_body

    def recording(body: bytes) -> object:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return parse(body)

    return recording


def test_a_large_body_is_parsed_off_the_event_loop_and_its_422_is_short(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_loop: list[bool] = []
    monkeypatch.setattr(server.http.limits, "parse_json_body", _where(on_loop))
    rows = 800_000  # 3.2 MB of counts, far more cells than a request may hold
    body = b'{"genes": ["GENE0"], "counts": [' + b",".join([b"[1]"] * rows) + b"]}"
    small = httpx.post(f"{url}/impute", json={"genes": ["GENE0"], "counts": [[1]], "steps": 2})
    large = httpx.post(f"{url}/impute", content=body, timeout=60,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert small.status_code == 200, small.text
    assert on_loop == [True, False]  # the small body on the loop, the large one in a thread
    assert large.status_code == 422
    assert len(large.content) < 2 * EXCERPT_CHARS + 1024, len(large.content)
    [error] = large.json()["detail"]
    assert error["loc"] == ["body", "counts"]
    assert error["input"].endswith(f" ... (cut at {EXCERPT_CHARS} characters)")
