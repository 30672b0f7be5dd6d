"""The engine's cells equal the reference loop's (``sedd.diffusion.reference``) bit for bit.

The reference sampler is the executable spec: one request, a plain loop over the time grid. The
engine packs many requests' rows into shared fixed-shape forwards, splits them over ticks and
admits them at different steps; none of that may change a cell. Checked for both samplers, both
time grids, temperature, every conditioning kind (perturbation indices with and without cell
types, precomputed perturbation vectors, unconditional models of both graphs and both
parametrisations) and imputation, with the jobs of each model run together in one engine.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch
from devices import DEVICE
from engine_models import FP32, LOADED

import sedd
from sedd.defaults import PREDICTORS, SamplingOptions
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.reference import reference_sample
from sedd.diffusion.sampling import Sampler
from sedd.diffusion.steps import step_kind
from sedd.engine import Engine, EngineJob, ModelLimits, run_jobs
from sedd.models.st3 import SEDDPerturbationTransformer, SEDDTransformer

# every kind of reverse step the library has (``sedd.diffusion.steps``): a new one is checked
# here without being named
SAMPLERS, GRIDS = PREDICTORS, ("uniform", "cosine")
BOUNDS = (0.0, 0.7, 3.0)  # entropy bounds (nats): one gene a forward, a few, many


def reference_of(sampler: Sampler, job: EngineJob, num_genes: int | None) -> torch.Tensor:
    """The job's cells from the reference loop, on the engine's own sampler (same blocks)."""
    return reference_sample(
        sampler, job.x_init, job.sampling, num_cells=job.num_cells, num_genes=num_genes,
        first_cell=job.first_cell, eps=job.eps, denoise=job.denoise, fixed=job.fixed,
        labels=job.labels, cell_types=job.cell_types,
    ).cpu()  # fmt: skip


def run_together(engine: Engine, jobs: list[EngineJob]) -> list[torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    run_jobs(engine, jobs, lambda k, result: out.__setitem__(k, result.tokens))
    return [out[k] for k in range(len(jobs))]


def samplers(absorbing: bool = True) -> tuple[str, ...]:
    """The step kinds a model on this graph takes."""
    return tuple(s for s in SAMPLERS if absorbing or not step_kind(s).absorbing_only)


def sampling_jobs(
    num_cells: int, absorbing: bool = True, **conditioning: object
) -> list[EngineJob]:
    """One job per sampler x grid x temperature, each on its own seed and cells (and the
    entropy-bounded step at each of ``BOUNDS``)."""
    jobs = []
    settings = itertools.product(samplers(absorbing), GRIDS, (1.0, 0.7))
    for k, (sampler, grid, temp) in enumerate(settings):
        options = SamplingOptions(3 + k % 3, grid, sampler, temp, seed=k,  # type: ignore[arg-type]
                                  entropy_bound=BOUNDS[k % 3])  # fmt: skip
        jobs.append(EngineJob(num_cells, options, first_cell=5 * k, **conditioning))  # type: ignore[arg-type]
    return jobs


def assert_engine_equals_reference(
    sampler: Sampler, limits: ModelLimits, jobs: list[EngineJob], rows_per_tick: int
) -> None:
    engine = Engine(sampler, limits, max_rows_per_forward=rows_per_tick)
    for job, cells in zip(jobs, run_together(engine, jobs), strict=True):
        expected = reference_of(sampler, job, limits.num_genes)
        assert torch.equal(cells, expected), job.sampling


def random_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough that the outputs vary (st3's 0.02 init gives near-uniform logits)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model.eval().to(DEVICE)


@pytest.mark.parametrize("cell_types", [True, False])
def test_perturbation_indices(cell_types: bool):
    n = 5
    labels = torch.tensor([1, 3, 0, 2, 1])
    extra = {"cell_types": torch.tensor([0, 1, 1, 0, 1])} if cell_types else {}
    sampler = Sampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32, block_rows=3)
    jobs = sampling_jobs(n, labels=labels, **extra)
    assert_engine_equals_reference(sampler, ModelLimits.of_model(LOADED), jobs, rows_per_tick=7)


def test_precomputed_perturbation_vectors():
    torch.manual_seed(1)
    model = random_weights(SEDDPerturbationTransformer(
        num_genes=9, num_bins=5, num_perturbations=3, hidden_dim=16, num_layers=1, num_heads=2,
        precomputed_emb_dim=4,
    ))  # fmt: skip
    sampler = Sampler(model, LogLinearNoise(), AbsorbingGraph(5), precision=FP32, block_rows=2)
    jobs = sampling_jobs(4, labels=torch.randn(4, 4))
    limits = ModelLimits.of_module(model, 9)
    assert_engine_equals_reference(sampler, limits, jobs, rows_per_tick=5)


def test_unconditional_st3_model():
    model = random_weights(SEDDTransformer(num_genes=11, num_bins=6, hidden_dim=16, num_layers=1,
                                           num_heads=2))  # fmt: skip
    sampler = Sampler(model, LogLinearNoise(), AbsorbingGraph(6), precision=FP32, block_rows=4)
    limits = ModelLimits.of_module(model, 11)
    assert_engine_equals_reference(sampler, limits, sampling_jobs(6), rows_per_tick=9)


@pytest.mark.parametrize("graph", ["uniform", "absorb"])
def test_reference_sedd_score_models(graph: str):
    """DDiT (score parametrisation); the uniform graph draws start tokens from each cell's
    stream, so the engine's admission at later ticks must not change them."""
    path = Path(__file__).parents[1] / "data" / "sedd_reference" / graph / "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference models have positional genes
        loaded = sedd.load(path, device=DEVICE, precision="fp32").loaded
    sampler = Sampler(loaded.model, loaded.noise, loaded.graph, precision=FP32, block_rows=2)
    jobs = sampling_jobs(3, absorbing=graph == "absorb")[:4]
    if graph == "absorb":  # and every kind of step
        jobs += [job for job in sampling_jobs(3) if job.sampling.sampler == "entropy"][:2]
    assert_engine_equals_reference(sampler, ModelLimits.of_model(loaded), jobs, rows_per_tick=5)


def test_imputation_keeps_given_genes_and_equals_the_reference():
    n, genes, mask = 4, 10, LOADED.graph.mask_index
    torch.manual_seed(2)
    x_init = torch.randint(0, mask, (n, genes))
    fixed = torch.rand(n, genes) < 0.4
    x_init[~fixed] = mask
    labels = torch.tensor([0, 1, 2, 3])
    sampler = Sampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32, block_rows=3)
    jobs = sampling_jobs(n, labels=labels, x_init=x_init, fixed=fixed)
    # a generated job rides along in the same forwards as the imputations
    jobs.append(EngineJob(n, SamplingOptions(4, seed=99), labels=labels))
    assert_engine_equals_reference(sampler, ModelLimits.of_model(LOADED), jobs, rows_per_tick=6)
    cells = reference_of(sampler, jobs[0], genes)
    assert torch.equal(cells[fixed], x_init[fixed]) and (cells != mask).all()


def test_the_bundled_model_through_its_engine():
    """The engine a ``sedd.load()`` model runs (its default block rows), with conditions packed."""
    model = sedd.load(device=DEVICE, precision="fp32")
    loaded = model.loaded
    engine = Engine.for_model(loaded, FP32, max_rows_per_forward=4)
    jobs = [
        EngineJob(3, SamplingOptions(4, grid, sampler, seed=k), labels=torch.full((3,), k + 1))  # type: ignore[arg-type]
        for k, (sampler, grid) in enumerate(itertools.product(samplers(), GRIDS))
    ]
    for job, cells in zip(jobs, run_together(engine, jobs), strict=True):
        assert torch.equal(cells, reference_of(engine.sampler, job, loaded.config.num_genes))
