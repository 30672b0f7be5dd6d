"""A step the GPU never waits for, pinned with deterministic proxies on the CPU.

``torch.profiler`` on the CPU sees every op a step would launch on a GPU and every value it reads
back (``aten::item``, ``aten::_local_scalar_dense``, ``aten::nonzero``); the engine counts its own
readback (``Engine.readbacks``), which is a sync on CUDA that the CPU profiler cannot see. Times
are not asserted here (``sedd bench --overhead`` prints them).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from checkpoint_files import ST3
from engine_models import engine_job

from sedd.bench.overhead import profile_ticks
from sedd.checkpoints import LoadedModel, load_checkpoint
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, EngineJob, ModelLimits
from sedd.precision import PrecisionPolicy

FP32 = PrecisionPolicy(device=torch.device("cpu"), amp_dtype=None)
BLOCK = 256


@pytest.fixture(scope="module")
def tiny_mlm() -> LoadedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # positional genes
        return load_checkpoint(ST3 / "tiny_mlm", device="cpu")


def steady_tick(loaded: LoadedModel, jobs: list[EngineJob]) -> tuple[float, float]:
    """(aten ops, syncs) of one engine tick in mid-run, every row in one block of 256."""
    sampler = Sampler(loaded.model, loaded.noise, loaded.graph, precision=FP32, block_rows=BLOCK)
    engine = Engine(sampler, ModelLimits.of_model(loaded), max_rows_per_forward=BLOCK)
    for job in jobs:
        engine.submit(job)
    engine.tick()  # admission and the first step
    engine.tick()
    return profile_ticks(engine)


@pytest.mark.parametrize("rows", [1, 16, 64, 256])
def test_a_tick_reads_back_once_whatever_the_rows(tiny_mlm: LoadedModel, rows: int):
    ops, syncs = steady_tick(tiny_mlm, [engine_job(rows, steps=10, seed=3)])
    assert syncs == 1  # the engine's one small readback; no item/nonzero anywhere
    assert ops > 100


def test_ops_per_tick_do_not_grow_with_rows(tiny_mlm: LoadedModel):
    counts = {rows: steady_tick(tiny_mlm, [engine_job(rows, steps=10, seed=3)])[0]
              for rows in (1, 16, 64, 256)}  # fmt: skip
    print(counts)
    assert abs(counts[256] - counts[1]) <= 0.05 * counts[1]
    assert max(counts.values()) - min(counts.values()) <= 0.05 * counts[1]


def test_a_tick_of_mixed_requests_still_reads_back_once(tiny_mlm: LoadedModel):
    """Euler and analytic rows, tempered and not, an imputation and rows at their denoise, all
    packed in one step: the branches are chosen from the jobs' settings, not from tensors."""
    genes, mask = tiny_mlm.config.num_genes, tiny_mlm.graph.dim - 1
    x_init = torch.full((3, genes), mask)
    x_init[:, :10] = 2
    fixed = torch.zeros(3, genes, dtype=torch.bool)
    fixed[:, :10] = True
    base = engine_job(4, steps=8, seed=1)
    jobs = [
        base,
        engine_job(4, steps=8, sampler="analytic", temperature=0.7, seed=2),
        engine_job(3, steps=8, x_init=x_init, fixed=fixed, seed=3),
        engine_job(4, steps=1, seed=4),  # at its final denoise on the measured tick
    ]
    ops, syncs = steady_tick(tiny_mlm, jobs)
    assert syncs == 1 and ops > 100


def test_the_step_path_has_no_data_dependent_ops(tiny_mlm: LoadedModel):
    """No op whose output shape depends on values (boolean gathers, nonzero, unique) runs in a
    tick, so the block step can be captured as a CUDA graph."""
    sampler = Sampler(
        tiny_mlm.model, tiny_mlm.noise, tiny_mlm.graph, precision=FP32, block_rows=BLOCK
    )
    engine = Engine(sampler, ModelLimits.of_model(tiny_mlm), max_rows_per_forward=BLOCK)
    engine.submit(engine_job(5, steps=6, seed=0))
    engine.tick()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        engine.tick()
    names = {event.name for event in prof.events()}
    dynamic = {"aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2",
               "aten::index_put_", "aten::masked_scatter_"}  # fmt: skip
    assert names & dynamic == set()
    assert "aten::item" not in names and "aten::_local_scalar_dense" not in names
