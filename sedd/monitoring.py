"""Throughput and memory figures that every output reports.

``PeakMemory`` measures the peak memory of a block: ``torch.cuda.max_memory_allocated`` on CUDA;
on CPU the peak resident set size above the level at entry, sampled every 2 ms by a thread (a
process's own peak RSS cannot be reset between runs, so ``ru_maxrss`` would not do).
"""

from __future__ import annotations

import os
import threading
import time

import torch


def process_rss_bytes() -> int:
    """The process's resident set size now (``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # not Linux: fall back to the process peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
