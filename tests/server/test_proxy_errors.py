"""Behind Ray Serve (``sedd serve --replicas``): the proxy's own failures become our JSON, and
/metrics merges every replica's figures under a ``replica`` label. No Ray needed here: the
middleware and the merge are plain ASGI and Prometheus text."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.metrics import ServiceMetrics, merge_replicas
from server.ray.model_routing import ModelHeader
from server.ray.proxy_errors import JsonProxyErrors, RayRoutesKey, proxy_middlewares

pytestmark = pytest.mark.anyio
App = Callable[[dict, Any, Any], Awaitable[None]]


def replying(status: int | None, body: bytes = b"", headers: list | None = None) -> App:
    """An ASGI app standing in for Ray's proxy: one response, or none at all."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if status is None:
            return  # a replica died: Ray's proxy sends nothing
        start = {"type": "http.response.start", "status": status, "headers": headers or []}
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


async def through(app: App) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await JsonProxyErrors(app)({"type": "http"}, None, send)
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in bodies)


async def test_a_dead_replica_becomes_a_json_503_that_says_to_retry() -> None:
    status, headers, body = await through(replying(None))
    assert status == 503 and headers[b"content-type"] == b"application/json"
    assert headers[b"retry-after"] == b"1" and "retry the request" in json.loads(body)["detail"]
    plain = replying(500, b"Internal Server Error", [(b"content-type", b"text/plain")])
    assert (await through(plain))[0] == 503


async def test_ray_back_pressure_becomes_our_429_with_retry_after() -> None:
    text = b"Request dropped due to backpressure (num_queued_requests=8, max_queued_requests=8)."
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", b"3")]
    status, got, body = await through(replying(503, text, headers))
    assert status == 429 and got[b"retry-after"] == b"3"
    assert json.loads(body)["detail"].startswith("every replica's request queue is full")


async def test_our_own_answers_pass_untouched() -> None:
    for status, kind in ((200, b"application/json"), (500, b"application/json"),
                         (200, b"text/event-stream"), (404, b"text/plain")):  # fmt: skip
        app = replying(status, b'{"detail": "x"}', [(b"content-type", kind)])
        assert await through(app) == (status, {b"content-type": kind}, b'{"detail": "x"}')
    # the key on Ray's own routes first (test_ray_routes_key.py), then these JSON answers
    assert [m.cls for m in proxy_middlewares()] == [RayRoutesKey, JsonProxyErrors, ModelHeader]


def test_metrics_of_every_replica_merge_under_a_replica_label() -> None:
    a, b = ServiceMetrics(), ServiceMetrics()
    a.requests.labels(route="/generate", outcome="ok", model="m").inc(3)
    b.requests.labels(route="/generate", outcome="ok", model="m").inc(5)
    b.requests.labels(route="/predict", outcome="rejected", model="").inc()
    merged = merge_replicas({"r1": a.render(), "r2": b.render()}).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    samples = {
        (s.labels["replica"], s.labels["route"], s.labels["outcome"]): s.value
        for s in families["sedd_requests"].samples
        if s.name == "sedd_requests_total"
    }
    assert samples == {
        ("r1", "/generate", "ok"): 3.0,
        ("r2", "/generate", "ok"): 5.0,
        ("r2", "/predict", "rejected"): 1.0,
    }
    assert merged.count("# TYPE sedd_requests_total counter") == 1  # one family, both replicas
