"""Prometheus metrics, in a registry per app (never the process-global one).

* ``requests_total{route, outcome}``: outcome is ok / rejected / cancelled / timeout / error,
  derived from the response status by ``MetricsMiddleware``.
* ``request_seconds{route}`` (end to end) and ``queue_seconds{route}`` histograms.
* Engine side (``EngineObserver``, called on the engine thread): rows per forward, step time,
  cells and tokens generated, fp32 fallbacks; cells/s and tokens/s over the last minute.
* Process RSS (current and peak) and, on CUDA, allocated accelerator memory (current and peak).
"""

from __future__ import annotations

import asyncio
import collections
import os
import resource
import threading
import time
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
RATE_WINDOW_S = 60.0


def outcome_for_status(status: int) -> str:
    """ok (2xx/3xx), cancelled (499: client went away), timeout (504), error (5xx), rejected."""
    if status < 400:
        return "ok"
    if status == 499:
        return "cancelled"
    if status == 504:
        return "timeout"
    return "error" if status >= 500 else "rejected"


class _Throughput:
    """Cells and tokens finished in the last ``RATE_WINDOW_S`` seconds, per second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[float, int, int]] = collections.deque()

    def add(self, cells: int, tokens: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), cells, tokens))

    def rate(self, index: int) -> float:
        cutoff = time.monotonic() - RATE_WINDOW_S
        with self._lock:
            while self._events and self._events[0][0] < cutoff:
                self._events.popleft()
            return sum(event[index] for event in self._events) / RATE_WINDOW_S


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return float("nan")


def _peak_rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


class ServiceMetrics:
    """All of one app's metrics; ``observer`` is handed to the engine."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.num_genes = 0
        reg = self.registry
        self.requests = Counter(
            "sedd_requests",
            "HTTP requests by route and outcome",
            ["route", "outcome"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "sedd_request_seconds",
            "end-to-end latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_seconds = Histogram(
            "sedd_queue_seconds",
            "time a job waited before its first step",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.rows_per_forward = Histogram(
            "sedd_rows_per_forward",
            "rows packed into one model forward",
            buckets=ROWS_BUCKETS,
            registry=reg,
        )
        self.step_seconds = Histogram(
            "sedd_step_seconds",
            "wall time of one engine step (forward + sampler)",
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        self.jobs = Counter("sedd_jobs", "engine jobs by outcome", ["outcome"], registry=reg)
        self.cells = Counter("sedd_cells_generated", "cells generated", registry=reg)
        self.tokens = Counter("sedd_tokens_generated", "gene tokens generated", registry=reg)
        self.fallbacks = Counter(
            "sedd_fp32_fallbacks", "rows recomputed in fp32 after a non-finite score", registry=reg
        )
        self._throughput = _Throughput()
        Gauge("sedd_cells_per_second", "cells/s over the last minute", registry=reg).set_function(
            lambda: self._throughput.rate(1)
        )
        Gauge("sedd_tokens_per_second", "tokens/s over the last minute", registry=reg).set_function(
            lambda: self._throughput.rate(2)
        )
        self.memory = Gauge("sedd_memory_bytes", "memory in use", ["kind"], registry=reg)
        self.memory.labels("process_rss").set_function(_rss_bytes)
        self.memory.labels("process_rss_peak").set_function(_peak_rss_bytes)
        self.engine_gauges = Gauge(
            "sedd_engine",
            "engine state: queued_jobs, active_jobs, active_rows",
            ["quantity"],
            registry=reg,
        )

    def attach(self, engine: Any, device: torch.device, num_genes: int) -> None:
        """At start-up: gauges read from the engine and the device at scrape time."""
        self.num_genes = num_genes
        if device.type == "cuda":
            self.memory.labels("cuda_allocated").set_function(
                lambda: float(torch.cuda.memory_allocated(device))
            )
            self.memory.labels("cuda_allocated_peak").set_function(
                lambda: float(torch.cuda.max_memory_allocated(device))
            )
        for name in ("queued_jobs", "active_jobs", "active_rows"):
            self.engine_gauges.labels(name).set_function(
                lambda name=name: float(getattr(engine, name))
            )

    # ---- EngineObserver (called on the engine thread) ------------------------------------

    def on_forward(self, rows: int, seconds: float) -> None:
        self.rows_per_forward.observe(rows)
        self.step_seconds.observe(seconds)

    def on_job_done(self, job: Any, result: Any, outcome: str) -> None:
        self.jobs.labels(outcome).inc()
        if result is None:
            return
        cells = int(result.tokens.shape[0])
        self.cells.inc(cells)
        self.tokens.inc(cells * self.num_genes)
        self._throughput.add(cells, cells * self.num_genes)
        if result.fp32_fallbacks:
            self.fallbacks.inc(result.fp32_fallbacks)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every HTTP request by route template and outcome, and times it end to end.

    A route may set ``scope["sedd.outcome"]`` when its status does not tell (a stream that
    started with 200 and then failed).
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:  # the server gave up on the connection
            scope.setdefault("sedd.outcome", "cancelled")
            raise
        except BaseException:
            status = 500 if status < 400 else status
            raise
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            outcome = scope.get("sedd.outcome") or outcome_for_status(status)
            self.metrics.requests.labels(route, outcome).inc()
            self.metrics.request_seconds.labels(route).observe(time.perf_counter() - start)
