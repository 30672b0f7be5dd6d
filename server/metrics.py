"""Prometheus metrics, in a registry per app (never the process-global one).

Every request and engine series carries ``model``: the id of the model that served it
(``server.model_host``; "" for routes that serve none: probes, /metrics, model cards, 404s).

* ``requests_total{route, outcome, model}``: outcome is ok / rejected / cancelled / timeout /
  error, derived from the response status by ``MetricsMiddleware``.
* ``request_seconds{route, model}`` (end to end) and ``queue_seconds{route, model}`` histograms.
* Engine side (``ModelObserver``, one per model's engine, called on the engine thread): rows per
  forward, step time, forwards, cells and tokens generated, fp32 fallbacks, engine gauges.
* From the app's ``sedd.engine.monitor.Monitor`` (created by the lifespan, fed by the observer), one
  snapshot per scrape: cells/s, tokens/s and forwards/s over the last minute; process RSS
  (current and peak) and, on CUDA, allocated accelerator memory (current and peak since
  start-up); and, where NVML reads the GPU, its utilisation and device memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sedd.engine.monitor import Monitor, MonitorSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
FORWARDS_PER_CELL_BUCKETS = (1, 2, 4, 6, 8, 10, 12, 16, 24, 32, 51, 64, 101, 256)
RATE_WINDOW_S = 60.0  # the window of the /s gauges: pass it as the app Monitor's ``window_s``
_MIB = 2**20


def outcome_for_status(status: int) -> str:
    """ok (2xx/3xx), cancelled (499: client went away), timeout (504), error (5xx), rejected."""
    if status < 400:
        return "ok"
    if status == 499:
        return "cancelled"
    if status == 504:
        return "timeout"
    return "error" if status >= 500 else "rejected"


class MonitorCollector(Collector):
    """The gauges read from the app's ``Monitor``: one snapshot per scrape, none before attach."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        # names only, so registering never takes a snapshot
        return iter(monitor_families(None))

    def collect(self) -> Iterator[Metric]:
        monitor = self._metrics.monitor
        if monitor is None:
            return iter(())
        return iter(monitor_families(monitor.snapshot()))


def monitor_families(snap: MonitorSnapshot | None) -> list[Metric]:
    """The families, with samples from ``snap`` (none when ``snap`` is None)."""
    rates = {
        "sedd_cells_per_second": ("cells/s over the last minute", "cells_per_s"),
        "sedd_tokens_per_second": ("tokens/s over the last minute", "tokens_per_s"),
        "sedd_forwards_per_second": ("model forwards/s over the last minute", "forwards_per_s"),
    }
    families: list[Metric] = [
        GaugeMetricFamily(name, doc, value=None if snap is None else getattr(snap, field))
        for name, (doc, field) in rates.items()
    ]
    memory = GaugeMetricFamily("sedd_memory_bytes", "memory in use", labels=["kind"])
    gpu_busy = GaugeMetricFamily(
        "sedd_gpu_utilization_ratio", "share of NVML's last sample period the GPU was busy"
    )
    gpu_memory = GaugeMetricFamily(
        "sedd_gpu_memory_bytes", "GPU device memory from NVML (all processes)", labels=["kind"]
    )
    families += [memory, gpu_busy, gpu_memory]
    if snap is None:
        return families
    memory.add_metric(["process_rss"], snap.process_rss_mib * _MIB)
    memory.add_metric(["process_rss_peak"], snap.process_peak_rss_mib * _MIB)
    if snap.memory_kind == "cuda_allocated":
        memory.add_metric(["cuda_allocated"], snap.memory_current_mib * _MIB)
        memory.add_metric(["cuda_allocated_peak"], snap.memory_peak_mib * _MIB)
    if snap.gpu_utilization_pct is not None:
        gpu_busy.add_metric([], snap.gpu_utilization_pct / 100)
    if snap.gpu_memory_used_mib is not None and snap.gpu_memory_total_mib is not None:
        gpu_memory.add_metric(["used"], snap.gpu_memory_used_mib * _MIB)
        gpu_memory.add_metric(["total"], snap.gpu_memory_total_mib * _MIB)
    return families


class ServiceMetrics:
    """All of one app's metrics; ``observe(model_id, engine, num_genes)`` gives each model's
    engine its observer."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.num_genes = 0
        self.monitor: Monitor | None = None  # the lifespan's, from ``attach``
        reg = self.registry
        self.requests = Counter(
            "sedd_requests",
            "HTTP requests by route, outcome and model",
            ["route", "outcome", "model"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "sedd_request_seconds",
            "end-to-end latency",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_seconds = Histogram(
            "sedd_queue_seconds",
            "time a job waited before its first step",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.rows_per_forward = Histogram(
            "sedd_rows_per_forward",
            "rows packed into one model forward",
            ["model"],
            buckets=ROWS_BUCKETS,
            registry=reg,
        )
        self.step_seconds = Histogram(
            "sedd_step_seconds",
            "wall time of one engine step (forward + sampler)",
            ["model"],
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        self.jobs = Counter(
            "sedd_jobs", "engine jobs by outcome", ["outcome", "model"], registry=reg
        )
        self.forwards = Counter(
            "sedd_forwards", "model forwards run (calls)", ["model"], registry=reg
        )
        self._rows = (0, 0)  # (stepped, computed) since start, every model: the padding gauge's
        self.rows_stepped = Counter(
            "sedd_rows_stepped", "rows of requests stepped by model forwards", ["model"],
            registry=reg,
        )  # fmt: skip
        self.rows_computed = Counter(
            "sedd_rows_computed",
            "rows model forwards computed: whole row blocks, padding rows included",
            ["model"],
            registry=reg,
        )
        Gauge(
            "sedd_rows_computed_per_stepped",
            "rows computed / rows stepped since start (1: no padding; 0 before any forward)",
            registry=reg,
        ).set_function(self._padding)
        self.cells = Counter("sedd_cells_generated", "cells generated", ["model"], registry=reg)
        # forwards per cell = sedd_cell_forwards / sedd_cells_generated; genes committed per
        # forward = sedd_genes_committed / sedd_cell_forwards
        self.cell_forwards = Counter(
            "sedd_cell_forwards", "forwards summed over the cells generated", ["model"],
            registry=reg,
        )  # fmt: skip
        self.genes_committed = Counter(
            "sedd_genes_committed", "genes drawn from the mask over the cells generated",
            ["model"], registry=reg,
        )  # fmt: skip
        self.forwards_per_cell = Histogram(
            "sedd_forwards_per_cell",
            "forwards a cell took, one observation per finished request (its mean)",
            ["model"],
            buckets=FORWARDS_PER_CELL_BUCKETS,
            registry=reg,
        )
        self.tokens = Counter(
            "sedd_tokens_generated", "gene tokens generated", ["model"], registry=reg
        )
        self.fallbacks = Counter(
            "sedd_fp32_fallbacks", "rows recomputed in fp32 after a non-finite score", ["model"],
            registry=reg,
        )  # fmt: skip
        reg.register(MonitorCollector(self))
        self.engine_gauges = Gauge(
            "sedd_engine",
            "engine state: queued_jobs, active_jobs, active_rows",
            ["quantity", "model"],
            registry=reg,
        )

    def attach(self, monitor: Monitor) -> None:
        """At start-up: the process gauges read ``monitor`` (started, on the default model's
        device, with ``window_s=RATE_WINDOW_S``) at scrape time; every observer feeds it."""
        self.num_genes = monitor.num_genes
        self.monitor = monitor

    def observe(self, model_id: str, engine: Any, num_genes: int) -> ModelObserver:
        """The observer of ``model_id``'s ``engine``, and its engine gauges."""
        for name in ("queued_jobs", "active_jobs", "active_rows"):
            self.engine_gauges.labels(name, model_id).set_function(
                lambda name=name: float(getattr(engine, name))
            )
        for series in (
            self.forwards,
            self.rows_stepped,
            self.rows_computed,
            self.cells,
            self.cell_forwards,
            self.genes_committed,
            self.tokens,
            self.fallbacks,
        ):
            series.labels(model_id)  # each model's series from 0, before its first job
        return ModelObserver(self, model_id, num_genes, int(engine.sampler.block_rows))

    def forget(self, model_id: str) -> None:
        """An unloaded model's engine gauges go (its counters stay: they count what it did)."""
        for name in ("queued_jobs", "active_jobs", "active_rows"):
            with contextlib.suppress(KeyError):  # never observed
                self.engine_gauges.remove(name, model_id)

    def _padding(self) -> float:
        stepped, computed = self._rows
        return computed / stepped if stepped else 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merge_replicas(texts: dict[str, bytes]) -> bytes:
    """One exposition of several replicas' ``render()`` (replica id -> text): each sample gains
    a ``replica`` label, and each metric family appears once, with every replica's samples."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(
                family.name,
                Metric(family.name, family.documentation, family.type, family.unit),
            )
            for sample in family.samples:
                labels = {**sample.labels, "replica": replica}
                merged.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    """A collector of metric families already gathered."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class ModelObserver:
    """One model's engine observer (``EngineObserver``, called on the engine thread): its series
    under ``model=<id>``, and the process monitor's rates."""

    def __init__(
        self, metrics: ServiceMetrics, model_id: str, num_genes: int, block_rows: int
    ) -> None:
        self.metrics, self.model_id = metrics, model_id
        self.num_genes, self.block_rows = num_genes, block_rows  # rows every forward computes

    def on_forward(self, rows: int, seconds: float, calls: int = 1) -> None:
        m, model = self.metrics, self.model_id
        for _ in range(calls):  # the step's rows, spread over its model calls
            m.rows_per_forward.labels(model).observe(rows / calls)
        m.step_seconds.labels(model).observe(seconds)
        m.forwards.labels(model).inc(calls)
        computed = calls * self.block_rows
        m.rows_stepped.labels(model).inc(rows)
        m.rows_computed.labels(model).inc(computed)
        m._rows = (m._rows[0] + rows, m._rows[1] + computed)
        if m.monitor is not None:
            m.monitor.add_forward(rows, calls)

    def on_job_done(self, job: Any, result: Any, outcome: str) -> None:
        m, model = self.metrics, self.model_id
        m.jobs.labels(outcome, model).inc()
        if result is None:
            return
        cells = int(result.tokens.shape[0])
        m.cells.labels(model).inc(cells)
        m.tokens.labels(model).inc(cells * self.num_genes)
        m.cell_forwards.labels(model).inc(result.row_forwards)
        m.genes_committed.labels(model).inc(result.genes_committed)
        if cells:
            m.forwards_per_cell.labels(model).observe(result.row_forwards / cells)
        if m.monitor is not None:
            m.monitor.add_cells(cells, result.row_forwards, result.genes_committed)
        if result.fp32_fallbacks:
            m.fallbacks.labels(model).inc(result.fp32_fallbacks)


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
            model = scope.get("sedd.model", "")  # set by the route that picked one
            self.metrics.requests.labels(route, outcome, model).inc()
            elapsed = time.perf_counter() - start
            self.metrics.request_seconds.labels(route, model).observe(elapsed)
