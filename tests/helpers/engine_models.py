"""A tiny random st3 perturbation model and engine-job helpers, shared by the engine, CUDA-graph
and precision tests (imported by name: ``tests/helpers`` is on the path)."""

from __future__ import annotations

from pathlib import Path

import torch
from devices import DEVICE

from sedd.checkpoints import LoadedModel
from sedd.checkpoints.schema import ModelConfig
from sedd.defaults import OPTION_NAMES, SamplingOptions
from sedd.diffusion.graph import graph_from_config
from sedd.diffusion.noise import noise_from_config
from sedd.diffusion.reference import reference_sample
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, EngineJob
from sedd.engine.forwards import block_rows_for
from sedd.models.st3 import SEDDPerturbationTransformer
from sedd.precision import PrecisionPolicy
from sedd.request.plan import GenerationRequest

GENES, BINS, PERTS = 10, 5, 4
FP32 = PrecisionPolicy(device=DEVICE, amp_dtype=None)


def tiny_loaded() -> LoadedModel:
    """A random st3 perturbation model with weights large enough that its outputs vary."""
    torch.manual_seed(0)
    arch = dict(
        num_genes=GENES, num_bins=BINS, num_perturbations=PERTS, hidden_dim=16, num_layers=1,
        num_heads=2, num_cell_types=2,
    )  # fmt: skip
    model = SEDDPerturbationTransformer(**arch).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)  # st3's 0.02 gives near-uniform logits
    config = ModelConfig(
        architecture="st3_perturbation",
        arch=arch,
        parametrisation="x0",
        graph={"type": "absorb", "dim": BINS + 1},
        noise={"type": "loglinear", "eps": 1e-3},
        tokens={"num_bins": BINS, "mask_index": BINS, "vocab_size": BINS + 1},
        genes=[f"g{i}" for i in range(GENES)],
        perturbations=["ctrl", "A", "B", "C"],
        control_label="ctrl",
        cell_types=["T", "NK"],
    )
    return LoadedModel(
        model=model.to(DEVICE),
        config=config,
        noise=noise_from_config(config.noise.model_dump()),
        graph=graph_from_config(config.graph.model_dump()),
        path=Path("tiny"),
        file_hash="",
    )


LOADED = tiny_loaded()


def solo(job: EngineJob, loaded: LoadedModel = LOADED) -> torch.Tensor:
    """The job run alone through the reference loop (the spec), on the engine's fixed blocks."""
    rows = block_rows_for(GENES, DEVICE)  # what Engine.for_model uses
    sampler = Sampler(loaded.model, loaded.noise, loaded.graph, precision=FP32, block_rows=rows)
    return reference_sample(
        sampler, job.x_init, job.sampling, num_cells=job.num_cells, num_genes=GENES,
        first_cell=job.first_cell, eps=job.eps, denoise=job.denoise, fixed=job.fixed,
        labels=job.labels, cell_types=job.cell_types,
    ).cpu()  # fmt: skip


def job(n: int, steps: int = 4, label: int = 1, **kw: object) -> EngineJob:
    labels = torch.full((n,), label, dtype=torch.long)
    cell_types = torch.zeros(n, dtype=torch.long)
    return engine_job(n, steps, labels=labels, cell_types=cell_types, **kw)


def run_until_idle(engine: Engine, limit: int = 200) -> int:
    ticks = 0
    while engine.tick():
        ticks += 1
        assert ticks < limit
    return ticks


def split_options(kw: dict[str, object]) -> SamplingOptions:
    """The sampling options among keywords (``grid`` spelled as the engine job once spelled
    it), removed from ``kw``; the rest stay."""
    if "grid" in kw:
        kw["time_grid"] = kw.pop("grid")
    return SamplingOptions(**{name: kw.pop(name) for name in OPTION_NAMES if name in kw})  # type: ignore[arg-type]


def engine_job(num_cells: int, steps: int | None = None, **kw: object) -> EngineJob:
    """An ``EngineJob`` with its sampling options given flat, as tests write them."""
    if steps is not None:
        kw["steps"] = steps
    return EngineJob(num_cells, split_options(kw), **kw)  # type: ignore[arg-type]


def request_of(
    cells_per_condition: int,
    conditions: tuple[str, ...] | None = None,
    cell_type: str | None = None,
    **kw: object,
) -> GenerationRequest:
    """A ``GenerationRequest`` with its sampling options given flat, as tests write them."""
    return GenerationRequest(cells_per_condition, conditions, cell_type, split_options(kw), **kw)  # type: ignore[arg-type]
