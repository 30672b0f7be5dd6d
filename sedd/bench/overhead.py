"""Host overhead of an engine step: what a GPU would wait for between kernels.

On a CPU the model forward dominates a step, so host work there looks free. On a GPU it is not:
every op the host launches and every value it reads back costs host time while the accelerator
idles. This measures, per engine tick (one step of every in-flight row) at several numbers of
rows in flight, all in one row block:

* host milliseconds outside the model forward (tick wall time minus the forward's, timed with
  forward hooks, over ``ticks`` un-profiled ticks);
* aten ops the tick runs (``torch.profiler`` on the CPU sees every op a step would launch);
* host syncs: ``aten::item``, ``aten::_local_scalar_dense`` and ``aten::nonzero`` calls the
  profiler sees, plus the engine's own readbacks (``Engine.readbacks``: its one small tensor a
  tick, which is a sync on CUDA even where the CPU profiler cannot see one).

On CUDA launches are asynchronous and a replayed CUDA graph runs no module hooks, so there each
tick is timed on the device with CUDA events (``forward_ms``: the device's time a tick) and
``host_ms`` is the tick's host wall time beyond it; syncs are what CUDA's own sync debug mode
reports (``torch.cuda.set_sync_debug_mode("warn")``), pageable copies included.

``tests/engine/test_step_overhead.py`` pins the deterministic parts (ops and syncs); ``sedd bench
--overhead`` prints the table.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass

import torch
from torch import nn

from sedd.defaults import SamplingOptions
from sedd.diffusion.graph import AbsorbingGraph, Graph
from sedd.diffusion.noise import LogLinearNoise, Noise
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, EngineJob, ModelLimits
from sedd.models.st3 import SEDDTransformer
from sedd.precision import PrecisionPolicy

SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero"})


@dataclass(frozen=True)
class TickOverhead:
    rows: int  # rows in flight, all in one block
    host_ms: float  # per tick, outside the model forward
    forward_ms: float  # per tick, inside it
    aten_ops: float  # per tick
    syncs: float  # per tick: profiler-visible syncs plus engine readbacks

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def small_model(
    genes: int = 64, bins: int = 20, device: torch.device | str = "cpu"
) -> tuple[nn.Module, Noise, Graph]:
    """A random-weight st3 transformer the size of the ``tiny_mlm`` fixture (64 hidden, 2 layers,
    4 heads): a forward cheap enough that the host work around it shows."""
    torch.manual_seed(0)
    model = SEDDTransformer(genes, bins, 64, 2, 4).eval().to(device)
    return model, LogLinearNoise(), AbsorbingGraph(bins)


def cuda_syncs(engine: Engine, ticks: int = 1) -> float:
    """Host syncs per tick of ``engine`` on CUDA, as CUDA's sync debug mode reports them."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(ticks):
                engine.tick()
            torch.cuda.synchronize(engine.sampler.device)
    finally:
        torch.cuda.set_sync_debug_mode(before)
    found = [w for w in caught if "synchronizing CUDA operation" in str(w.message)]
    return (len(found) - 1) / ticks  # the closing synchronize is ours


def profile_ticks(engine: Engine, ticks: int = 1) -> tuple[float, float]:
    """(aten ops, host syncs) per tick over ``ticks`` ticks of ``engine``, under the profiler
    (on CUDA the syncs are ``cuda_syncs``')."""
    if engine.sampler.device.type == "cuda":
        ops, _ = _profiled(engine, ticks)
        return ops, cuda_syncs(engine, ticks)
    return _profiled(engine, ticks)


def _profiled(engine: Engine, ticks: int) -> tuple[float, float]:
    before = getattr(engine, "readbacks", 0)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(ticks):
            engine.tick()
    names = [event.name for event in prof.events()]
    ops = sum(1 for name in names if name.startswith("aten::"))
    syncs = sum(1 for name in names if name in SYNC_OPS)
    syncs += getattr(engine, "readbacks", 0) - before
    return ops / ticks, syncs / ticks


class _ForwardClock:
    """Forward hooks summing the wall time spent inside ``model``'s forward."""

    def __init__(self, model: nn.Module) -> None:
        self.seconds, self._start = 0.0, 0.0
        self._hooks = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._leave),
        ]

    def _enter(self, *_: object) -> None:
        self._start = time.perf_counter()

    def _leave(self, *_: object) -> None:
        self.seconds += time.perf_counter() - self._start

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def measure(
    model: nn.Module,
    noise: Noise,
    graph: Graph,
    policy: PrecisionPolicy,
    num_genes: int,
    rows_in_flight: list[int],
    *,
    ticks: int = 5,
    labels: torch.Tensor | None = None,
    **sampler_options: object,
) -> list[TickOverhead]:
    """``TickOverhead`` at each number of rows in flight, every row in one block of
    ``max(rows_in_flight)`` rows. ``labels`` (one) conditions every cell, for conditional models.
    """
    block = max(rows_in_flight)
    sampler = Sampler(
        model,
        noise,
        graph,
        precision=policy,
        block_rows=block,
        **sampler_options,  # type: ignore[arg-type]
    )
    limits = ModelLimits.of_module(model, num_genes)
    figures = []
    for rows in rows_in_flight:
        engine = Engine(sampler, limits, max_rows_per_forward=rows)
        cell_labels = None if labels is None else labels.expand(rows, *labels.shape[1:])
        # steps enough that no row finishes in the measured ticks (2 + ticks + 4): a finished
        # job's one readback of its tokens is not a step's work
        engine.submit(EngineJob(rows, SamplingOptions(ticks + 16, seed=0), labels=cell_labels))
        for _ in range(2):  # admission, then a first step
            engine.tick()
        if sampler.device.type == "cuda":
            wall, device = _device_timed(engine, ticks)
        else:
            wall, device = _hook_timed(engine, model, ticks)
        ops, syncs = profile_ticks(engine, 2)
        host_ms = 1000 * max(wall - device, 0.0) / ticks
        figures.append(TickOverhead(rows, host_ms, 1000 * device / ticks, ops, syncs))
        engine.stop(drain=False)
    return figures


def _hook_timed(engine: Engine, model: nn.Module, ticks: int) -> tuple[float, float]:
    """(wall, inside the forward) seconds of ``ticks`` ticks on the CPU, by forward hooks."""
    clock = _ForwardClock(model)
    try:
        start = time.perf_counter()
        for _ in range(ticks):
            engine.tick()
        return time.perf_counter() - start, clock.seconds
    finally:
        clock.close()


def _device_timed(engine: Engine, ticks: int) -> tuple[float, float]:
    """(host wall, device) seconds of ``ticks`` ticks on CUDA: CUDA events around each tick
    time the device (launches are asynchronous; graph replays run no hooks)."""
    device = engine.sampler.device
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * ticks)]
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for i in range(ticks):
        events[2 * i].record()
        engine.tick()
        events[2 * i + 1].record()
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    busy = sum(events[2 * i].elapsed_time(events[2 * i + 1]) for i in range(ticks)) / 1000
    return wall, busy
