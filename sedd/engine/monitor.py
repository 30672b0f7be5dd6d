"""A small run monitor shared by the CLIs and the server: throughput, memory, GPU utilisation.

``Monitor`` counts model forwards, rows and finished cells from the moment it starts, and
``snapshot()`` turns them into rates with the memory of the moment:

- cells/s, tokens/s (cells x genes per second) and forwards/s over the elapsed wall time, or,
  with ``window_s`` (a long-running server), over the last ``window_s`` seconds;
- memory: on CUDA, current and peak ``torch.cuda`` allocations since ``start``; always the
  process's current resident set size and its peak over the process lifetime (``ru_maxrss``);
- GPU utilisation and device memory from NVML, only when ``pynvml`` (package ``nvidia-ml-py``)
  imports and the monitored device is a CUDA GPU; otherwise those fields are ``None``.

A ``Monitor`` is an engine observer (``Engine(..., observer=monitor)``): the engine calls
``on_forward`` after every packed forward and ``on_job_done`` when a job ends, so forwards are
counted as they really ran. ``add_forward`` / ``add_cells`` count by hand.
``sedd.run.run_plan`` reports its stats from one; the server keeps one per app.
``PeakMemory`` measures the peak memory of one block (benchmarks):
``torch.cuda.max_memory_allocated`` on CUDA; on CPU the peak resident set size above the level at
entry, sampled every 2 ms by a thread (a process's own peak RSS cannot be reset between runs, so
``ru_maxrss`` would not do).
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

_MIB = 2**20


def process_rss_bytes() -> int:
    """The process's resident set size now (``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # not Linux: fall back to the process peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _JobLike(Protocol):
    num_cells: int


def process_peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class NvmlProbe:
    """GPU utilisation and memory of one CUDA device through NVML; ``None`` when unavailable.

    ``NvmlProbe.open(device)`` returns ``None`` unless ``pynvml`` imports, NVML initialises and
    ``device`` is a CUDA device: NVML is never required.
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, device: torch.device) -> NvmlProbe | None:
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return cls(pynvml, cls._handle_for(pynvml, device))
        except pynvml.NVMLError:
            return None

    @staticmethod
    def _handle_for(nvml: Any, device: torch.device) -> Any:
        # torch numbers devices after CUDA_VISIBLE_DEVICES, NVML does not: match by UUID.
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except nvml.NVMLError:
                pass
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict[str, float]:
        """``gpu_utilization_pct`` (busy share of the last sample period) and device memory;
        empty if NVML fails now (a lost GPU must not take the run's summary with it)."""
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except self._nvml.NVMLError:
            return {}
        return {
            "gpu_utilization_pct": float(util.gpu),
            "gpu_memory_used_mib": mem.used / _MIB,
            "gpu_memory_total_mib": mem.total / _MIB,
        }


@dataclass(frozen=True)
class MonitorSnapshot:
    """What ``Monitor.snapshot`` reports; ``as_dict`` is what goes into metrics JSON."""

    seconds: float
    cells: int
    tokens: int
    forwards: int
    rows: int  # batch rows summed over forwards (forward rows/s = rows / seconds)
    cells_per_s: float
    tokens_per_s: float
    forwards_per_s: float
    memory_kind: str  # "cuda_allocated" or "process_rss"
    memory_current_mib: float
    memory_peak_mib: float
    process_rss_mib: float
    process_peak_rss_mib: float
    gpu_utilization_pct: float | None = None
    gpu_memory_used_mib: float | None = None
    gpu_memory_total_mib: float | None = None
    rate_window_s: float | None = None  # rates over the last this many seconds; None: since start
    cell_forwards: int = 0  # forwards summed over the finished cells (a cell's share of each)
    genes_committed: int = 0  # genes drawn from the mask over the finished cells

    @property
    def forwards_per_cell(self) -> float:
        """Model forwards a finished cell took, on average (0 before any cell)."""
        return self.cell_forwards / self.cells if self.cells else 0.0

    @property
    def genes_per_forward(self) -> float:
        """Genes a cell committed per forward, on average (0 for the uniform graph)."""
        return self.genes_committed / self.cell_forwards if self.cell_forwards else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        gpu = (
            f", GPU {self.gpu_utilization_pct:.0f}% busy"
            if self.gpu_utilization_pct is not None
            else ""
        )
        return (
            f"{self.cells} cells in {self.seconds:.1f} s: {self.cells_per_s:.2f} cells/s, "
            f"{self.tokens_per_s:.0f} tokens/s, {self.forwards_per_s:.1f} forwards/s, "
            f"{self.forwards_per_cell:.2f} forwards a cell, memory "
            f"{self.memory_current_mib:.0f} MiB now / {self.memory_peak_mib:.0f} MiB peak "
            f"[{self.memory_kind}]{gpu}"
        )


class Monitor:
    """Counts forwards and cells of one run (or a server's lifetime); thread-safe.

    ``num_genes`` turns cells into tokens. ``window_s`` makes the rates those of the last
    ``window_s`` seconds (counted events / ``window_s``) instead of the whole run's; the counts
    stay totals since ``start``. ``clock`` is injectable for tests. Use as a context manager or
    call ``start()``; ``snapshot()`` may be called at any time after that.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        num_genes: int = 0,
        *,
        use_nvml: bool = True,
        window_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if num_genes < 0:
            raise ValueError(f"`num_genes` must be >= 0, got {num_genes}.")
        if window_s is not None and not window_s > 0:
            raise ValueError(
                f"`window_s` must be > 0 (or None for whole-run rates), got {window_s}."
            )
        self.device = torch.device(device)
        self.num_genes = num_genes
        self.window_s = window_s
        # (time, cells, forwards) of each event inside the window; only kept when window_s is set
        self._recent: collections.deque[tuple[float, int, int]] = collections.deque()
        self._clock = clock
        self._lock = threading.Lock()
        self._nvml = NvmlProbe.open(self.device) if use_nvml else None
        self._start: float | None = None
        self.cells = self.forwards = self.rows = 0
        self.cell_forwards = self.genes_committed = 0

    @property
    def nvml_available(self) -> bool:
        return self._nvml is not None

    def start(self) -> Monitor:
        """Zero the counters and the CUDA peak, and start the clock."""
        with self._lock:
            self.cells = self.forwards = self.rows = 0
            self.cell_forwards = self.genes_committed = 0
            self._recent.clear()
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self._start = self._clock()
        return self

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        return None

    def on_forward(self, rows: int, seconds: float, calls: int = 1) -> None:
        """Engine observer: a packed step over ``rows`` rows that ran ``calls`` forwards."""
        self.add_forward(rows, calls)

    def on_job_done(self, job: _JobLike, result: object, outcome: str) -> None:
        """Engine observer: a job ended; its cells, and what they cost (``JobResult``'s
        ``row_forwards`` and ``genes_committed``), count when it succeeded."""
        if outcome == "ok":
            self.add_cells(job.num_cells, getattr(result, "row_forwards", 0),
                           getattr(result, "genes_committed", 0))  # fmt: skip

    def add_forward(self, rows: int = 0, calls: int = 1) -> None:
        """``calls`` model forwards over ``rows`` batch rows in all."""
        with self._lock:
            self.forwards += calls
            self.rows += rows
            self._remember(cells=0, forwards=calls)

    def add_cells(self, n: int, cell_forwards: int = 0, genes_committed: int = 0) -> None:
        """``n`` cells finished, having taken ``cell_forwards`` forwards between them and
        drawn ``genes_committed`` genes."""
        if n < 0:
            raise ValueError(f"`n` must be >= 0, got {n}.")
        with self._lock:
            self.cells += n
            self.cell_forwards += cell_forwards
            self.genes_committed += genes_committed
            self._remember(cells=n, forwards=0)

    def _remember(self, *, cells: int, forwards: int) -> None:
        """Keep the event for windowed rates (caller holds the lock); drop the expired ones here
        too, so a server nobody scrapes does not pile them up."""
        if self.window_s is None:
            return
        now = self._clock()
        self._recent.append((now, cells, forwards))
        self._expire(now, self.window_s)

    def _expire(self, now: float, window_s: float) -> None:
        while self._recent and self._recent[0][0] < now - window_s:
            self._recent.popleft()

    def _memory(self) -> tuple[str, float, float]:
        if self.device.type == "cuda":
            return (
                "cuda_allocated",
                torch.cuda.memory_allocated(self.device) / _MIB,
                torch.cuda.max_memory_allocated(self.device) / _MIB,
            )
        return "process_rss", process_rss_bytes() / _MIB, process_peak_rss_bytes() / _MIB

    def snapshot(self) -> MonitorSnapshot:
        if self._start is None:
            raise RuntimeError("Monitor.snapshot() before start(): use `with Monitor(...)`.")
        with self._lock:
            now = self._clock()
            seconds = now - self._start
            cells, forwards, rows = self.cells, self.forwards, self.rows
            cell_forwards, genes_committed = self.cell_forwards, self.genes_committed
            if self.window_s is None:
                period, rate_cells, rate_forwards = seconds, cells, forwards
            else:
                self._expire(now, self.window_s)
                period = self.window_s
                rate_cells = sum(event[1] for event in self._recent)
                rate_forwards = sum(event[2] for event in self._recent)
        tokens = cells * self.num_genes

        def rate(count: int) -> float:
            return count / period if period > 0 else 0.0

        kind, current, peak = self._memory()
        gpu = self._nvml.read() if self._nvml is not None else {}
        return MonitorSnapshot(
            seconds=seconds,
            cells=cells,
            tokens=tokens,
            forwards=forwards,
            rows=rows,
            cells_per_s=rate(rate_cells),
            tokens_per_s=rate(rate_cells * self.num_genes),
            forwards_per_s=rate(rate_forwards),
            memory_kind=kind,
            memory_current_mib=current,
            memory_peak_mib=peak,
            process_rss_mib=process_rss_bytes() / _MIB,
            process_peak_rss_mib=process_peak_rss_bytes() / _MIB,
            rate_window_s=self.window_s,
            cell_forwards=cell_forwards,
            genes_committed=genes_committed,
            **gpu,
        )


class PeakMemory:
    """Context manager; ``mib`` is the block's peak memory in MiB, ``kind`` says which."""

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.002) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.kind = "cuda_max_allocated" if self.device.type == "cuda" else "process_rss_increase"
        self.mib = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self._peak = process_rss_bytes()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, process_rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak = max(self._peak, process_rss_bytes())
        self.mib = (self._peak - self._base) / 2**20
