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

On CUDA launches are asynchronous, the tick waits for the device at its readback, and a
replayed CUDA graph runs no module hooks, so there the host and the device are timed apart:
``host_ms`` is the host clock over the tick less its wait at the readback (the host's own work:
scheduling, launches, settling), ``forward_ms`` the device's time from the step's start to its
readback, by CUDA events. CUDA events around the whole tick would time the host's work too (the
device idles through it between them), leaving ``host_ms`` near 0. Syncs are what CUDA's own
sync debug mode reports (``torch.cuda.set_sync_debug_mode("warn")``), pageable copies included;
it does not see ``torch.cuda.synchronize``, so none is called while it counts.

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
    host_ms: float  # per tick: outside the model forward (CPU); the host's own work (CUDA)
    forward_ms: float  # per tick: inside the forward (CPU); the device's step (CUDA events)
    aten_ops: float  # per tick
    syncs: float  # per tick: profiler-visible syncs plus engine readbacks
    tick_ms: float = 0.0  # per tick, wall time by the host clock

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
    finally:
        torch.cuda.set_sync_debug_mode(before)
    # after the count: the debug mode does not see torch.cuda.synchronize on CUDA, so nothing
    # of ours may be subtracted from it
    torch.cuda.synchronize(engine.sampler.device)
    found = [w for w in caught if "synchronizing CUDA operation" in str(w.message)]
    return len(found) / ticks


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
            wall, host, device = _device_timed(engine, ticks)
        else:
            wall, device = _hook_timed(engine, model, ticks)
            host = max(wall - device, 0.0)
        ops, syncs = profile_ticks(engine, 2)
        ms = [1000 * seconds / ticks for seconds in (host, device, wall)]
        figures.append(TickOverhead(rows, ms[0], ms[1], ops, syncs, tick_ms=ms[2]))
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


def _device_timed(engine: Engine, ticks: int) -> tuple[float, float, float]:
    """(wall, host, device) seconds of ``ticks`` ticks on CUDA. The host clock times each tick
    and, apart, its wait at the readback (where the host idles until the device is done): host
    is the wall time less that wait. CUDA events from the step's start to its readback time the
    device (launches are asynchronous; graph replays run no hooks)."""
    device = engine.sampler.device
    stepper = engine._stepper
    step, read_back = stepper.step, stepper._read_back
    spans: list[list[torch.cuda.Event]] = []
    waited = 0.0

    def event() -> torch.cuda.Event:
        mark = torch.cuda.Event(enable_timing=True)
        mark.record(torch.cuda.current_stream(device))
        return mark

    def timed_step(blocks: list) -> None:
        spans.append([event()])
        step(blocks)

    def timed_read_back(proposals: list) -> object:
        nonlocal waited
        if spans and len(spans[-1]) == 1:  # the step's first readback ends its device work
            spans[-1].append(event())
        began = time.perf_counter()
        try:
            return read_back(proposals)
        finally:
            waited += time.perf_counter() - began

    stepper.step, stepper._read_back = timed_step, timed_read_back  # type: ignore[method-assign]
    try:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(ticks):
            engine.tick()
        wall = time.perf_counter() - start
        torch.cuda.synchronize(device)
    finally:
        del stepper.step, stepper._read_back  # the class's own again
    busy = sum(span[0].elapsed_time(span[1]) for span in spans if len(span) == 2) / 1000
    return wall, max(wall - waited, 0.0), busy
