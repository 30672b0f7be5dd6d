"""The run monitor: real counts from a real sampler, exact rates with a stepped clock, real RSS."""

from __future__ import annotations

import gc
import mmap
import threading
from types import SimpleNamespace

import pytest
import torch
from engine_models import engine_job

from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, ModelLimits, run_job
from sedd.engine.monitor import Monitor, NvmlProbe
from sedd.models.st3 import SEDDTransformer
from sedd.precision import resolve_precision


class SteppedClock:
    """Returns the given times in order: start() reads the first, snapshot() the next."""

    def __init__(self, *times: float) -> None:
        self._times = iter(times)

    def __call__(self) -> float:
        return next(self._times)


class ManualClock:
    """A clock that stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_sampler_forwards_rows_and_rates_are_counted_exactly() -> None:
    torch.manual_seed(0)
    genes, cells, steps = 8, 3, 4
    model = SEDDTransformer(genes, 4, 16, 1, 2).eval()
    sampler = Sampler(
        model, LogLinearNoise(), AbsorbingGraph(4), precision=resolve_precision("fp32", "cpu")
    )
    with Monitor("cpu", num_genes=genes, clock=SteppedClock(10.0, 12.5)) as monitor:
        engine = Engine(sampler, ModelLimits.of_module(model), observer=monitor)
        calls: list[int] = []
        hook = model.register_forward_hook(lambda *_: calls.append(1))
        result = run_job(engine, engine_job(cells, steps, seed=0))
        hook.remove()
    snap = monitor.snapshot()
    # the model calls themselves: 4 steps, and no denoise (4 uniform steps to t = 1e-5 leave
    # no mask for it), so not the "steps + 1" a step count would print
    assert snap.forwards == len(calls) == result.forwards == steps
    assert snap.rows == cells * steps
    assert snap.seconds == pytest.approx(2.5)
    assert snap.cells_per_s == pytest.approx(cells / 2.5)
    assert snap.tokens_per_s == pytest.approx(cells * genes / 2.5)
    assert snap.forwards_per_s == pytest.approx(steps / 2.5)
    assert "1.20 cells/s" in snap.line()


def test_resident_memory_grows_with_64_mib_written() -> None:
    """RSS is the whole process's: in a long session a thread left by an earlier test can free
    memory between the two snapshots (it failed once so), so the growth is measured up to three
    times, each time after a garbage collection. The 64 MiB are fresh anonymous pages, written:
    a tensor's could come from pages the allocator kept resident after an earlier test (in a
    full run the growth read 0 so)."""
    monitor = Monitor("cpu").start()
    growth = []
    for _ in range(3):
        gc.collect()
        before = monitor.snapshot()
        block = mmap.mmap(-1, 64 * 2**20)  # 64 MiB, written page by page so it is resident
        for page in range(0, len(block), mmap.PAGESIZE):
            block[page] = 1
        after = monitor.snapshot()
        assert after.memory_kind == "process_rss" and block[len(block) - mmap.PAGESIZE] == 1
        assert after.process_peak_rss_mib >= after.memory_current_mib - 1
        growth.append(after.memory_current_mib - before.memory_current_mib)
        block.close()
        if growth[-1] > 56:
            break
    assert max(growth) > 56, growth


def test_no_gpu_fields_without_cuda_and_nvml() -> None:
    monitor = Monitor("cpu", use_nvml=True).start()
    snap = monitor.snapshot()
    assert not monitor.nvml_available
    assert snap.gpu_utilization_pct is None and snap.gpu_memory_used_mib is None
    assert set(snap.as_dict()) >= {"cells_per_s", "tokens_per_s", "forwards_per_s"}


def test_counts_from_many_threads_are_not_lost() -> None:
    monitor = Monitor("cpu", num_genes=2).start()

    def work() -> None:
        for _ in range(1000):
            monitor.add_forward()
            monitor.add_cells(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = monitor.snapshot()
    assert (snap.forwards, snap.cells, snap.tokens) == (4000, 4000, 8000)


def test_windowed_rates_count_only_the_last_window_and_totals_everything() -> None:
    clock = ManualClock()
    monitor = Monitor("cpu", num_genes=12, window_s=60.0, clock=clock).start()
    clock.now = 10.0
    monitor.add_forward(rows=3)
    monitor.add_forward(rows=3)
    monitor.add_cells(3)
    clock.now = 50.0
    monitor.add_forward(rows=5)
    monitor.add_cells(5)
    clock.now = 65.0  # window 5..65: every event
    early = monitor.snapshot()
    assert early.rate_window_s == 60.0 and early.seconds == 65.0
    assert early.cells_per_s == pytest.approx(8 / 60)
    assert early.tokens_per_s == pytest.approx(8 * 12 / 60)
    assert early.forwards_per_s == pytest.approx(3 / 60)
    clock.now = 100.0  # window 40..100: only the events at 50
    late = monitor.snapshot()
    assert late.cells_per_s == pytest.approx(5 / 60)
    assert late.forwards_per_s == pytest.approx(1 / 60)
    assert (late.cells, late.tokens, late.forwards, late.rows) == (8, 96, 3, 11)
    clock.now = 200.0  # idle for longer than the window
    assert monitor.snapshot().cells_per_s == monitor.snapshot().forwards_per_s == 0.0


class FakeNvml:
    """The three NVML calls ``NvmlProbe.read`` makes, on a device with 87% utilisation."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> object:
        if self.fail:
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> object:
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30)


def test_nvml_probe_reads_utilisation_and_survives_a_lost_gpu() -> None:
    assert NvmlProbe(FakeNvml(), handle=0).read() == {
        "gpu_utilization_pct": 87.0,
        "gpu_memory_used_mib": 3072.0,
        "gpu_memory_total_mib": 81920.0,
    }
    assert NvmlProbe(FakeNvml(fail=True), handle=0).read() == {}


def test_misuse_raises_with_a_message() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        Monitor("cpu").snapshot()
    with pytest.raises(ValueError, match="`n` must be >= 0, got -1"):
        Monitor("cpu").start().add_cells(-1)
    with pytest.raises(ValueError, match="`num_genes` must be >= 0"):
        Monitor("cpu", num_genes=-3)
    with pytest.raises(ValueError, match=r"`window_s` must be > 0 \(or None.*got 0\."):
        Monitor("cpu", window_s=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_memory_is_tracked_from_start() -> None:
    monitor = Monitor("cuda").start()
    block = torch.ones(16 * 2**20, device="cuda")
    snap = monitor.snapshot()
    assert snap.memory_kind == "cuda_allocated"
    assert snap.memory_peak_mib >= 64 and snap.memory_current_mib >= 64
    del block
