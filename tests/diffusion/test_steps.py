"""The reverse-step seam (``sedd.diffusion.steps``) and the entropy-bounded step's decisions."""

from __future__ import annotations

import math

import pytest
import torch
from exact_models import ExactModel, potts_distribution, state_index

from sedd.defaults import PREDICTORS, SamplingOptions
from sedd.diffusion.graph import AbsorbingGraph, UniformGraph
from sedd.diffusion.noise import GeometricNoise, LogLinearNoise
from sedd.diffusion.sampling import Sampler, StepRows
from sedd.diffusion.steps import STEP_NAMES, STEPS, check_step_kind, kind_index, step_kind
from sedd.diffusion.steps.entropy_bounded import EntropyBoundedStep
from sedd.engine import Engine, EngineJob, ModelLimits, run_jobs

EB = EntropyBoundedStep()


def test_every_sampler_option_has_its_step_module_in_the_same_order() -> None:
    assert STEP_NAMES == PREDICTORS
    assert [kind_index(name) for name in PREDICTORS] == list(range(len(STEPS)))
    assert step_kind("entropy") is STEPS[2] and step_kind("entropy").adaptive
    with pytest.raises(ValueError, match=r"`sampler` must be one of euler, analytic, entropy"):
        kind_index("tau")


def test_a_grid_kind_takes_steps_plus_the_denoise_and_the_adaptive_one_its_cap() -> None:
    assert step_kind("euler").forwards(10, denoise=True) == 11
    assert step_kind("analytic").forwards(10, denoise=False) == 10
    assert EB.forwards(8, denoise=True) == 8  # the cap: its last forward commits every gene
    assert EngineJob(3, SamplingOptions(8, sampler="entropy")).total_steps == 8
    assert EngineJob(3, SamplingOptions(8)).total_steps == 9


def rows_of(x: torch.Tensor, bound: float, steps_left: int) -> StepRows:
    return StepRows.of_request(x, 1.0, 1.0, seed=3, step=0, kind=kind_index("entropy"),
                               entropy_bound=bound, steps_left=steps_left)  # fmt: skip


def spread(entropies: list[float], vocab: int = 64) -> torch.Tensor:
    """(1, L, V) jump weights whose rows have the given entropies (nats): uniform over e^H
    tokens where that is whole, for exact values."""
    probs = torch.zeros(1, len(entropies), vocab)
    for g, h in enumerate(entropies):
        n = round(math.exp(h))
        probs[0, g, :n] = 1.0 / n
    return probs


def test_the_bound_decides_how_many_genes_join_and_sure_genes_are_free() -> None:
    x = torch.full((1, 6), 63)
    active = torch.ones(1, 6, dtype=torch.bool)
    stay = torch.zeros(1, 6)
    # six genes of ln 4 = 1.386 nats each: k join while (k - 1) x 1.386 <= the bound
    probs = spread([math.log(4)] * 6)
    for bound, count in ((0.0, 1), (1.3, 1), (1.4, 2), (2.8, 3), (100.0, 6)):
        chosen = EB.choose(probs, stay, active, rows_of(x, bound, steps_left=6))
        assert int(chosen.sum()) == count, (bound, count)
    # genes the model is sure of (entropy 0) cost nothing: all of them join at a bound of 0
    sure = EB.choose(spread([0.0] * 6), stay, active, rows_of(x, 0.0, steps_left=6))
    assert bool(sure.all())


def test_the_floor_keeps_a_cell_within_its_cap() -> None:
    probs = spread([math.log(32)] * 10)  # every gene uncertain: the bound alone takes one
    x = torch.full((1, 10), 63)
    active = torch.ones(1, 10, dtype=torch.bool)
    for left, count in ((10, 1), (4, 3), (3, 4), (1, 10)):  # ceil(10 / forwards left)
        chosen = EB.choose(probs, torch.zeros(1, 10), active, rows_of(x, 0.0, left))
        assert int(chosen.sum()) == count, left
    # only masked (active) genes are ever chosen
    active[0, :7] = False
    chosen = EB.choose(probs, torch.zeros(1, 10), active, rows_of(x, 0.0, 1))
    assert chosen[0].tolist() == [False] * 7 + [True] * 3


def test_genes_join_in_the_cells_own_random_order() -> None:
    probs = spread([math.log(4)] * 40)
    x = torch.full((2, 40), 63)
    active = torch.ones(2, 40, dtype=torch.bool)
    rows = StepRows.of_request(x, 1.0, 1.0, seed=3, kind=2, entropy_bound=0.0, steps_left=10)
    chosen = EB.choose(probs.expand(2, -1, -1), torch.zeros(2, 40), active, rows)
    first, second = (set(torch.nonzero(c).flatten().tolist()) for c in chosen)
    assert len(first) == len(second) == 4
    assert first != second and first != {0, 1, 2, 3}  # not the index order
    # the same cell decides the same way alone (its own stream, nothing of its batch)
    alone = EB.choose(probs, torch.zeros(1, 40), active[:1], rows.take(slice(0, 1)))
    assert torch.equal(alone[0], chosen[0])


def test_an_adaptive_row_reads_its_time_off_its_tokens() -> None:
    x = torch.full((3, 8), 5)
    x[0] = 9  # every gene masked (the mask is 9 for 10 tokens)
    x[1, :4] = 9  # half
    t = EB.row_time(x, AbsorbingGraph(9), LogLinearNoise(1e-3))
    assert t.tolist() == pytest.approx([1.0, 0.5 / (1 - 1e-3), 1e-5])
    # any schedule: the time at which the noise masks that share, by bisection
    geometric = GeometricNoise(1e-3, 5.0)
    t = geometric.time_of_mask_fraction(torch.tensor([0.5, 0.9], dtype=torch.float64))
    assert (1 - torch.exp(-geometric.total_noise(t))).tolist() == pytest.approx([0.5, 0.9])


def test_the_adaptive_step_needs_the_absorbing_graph() -> None:
    check_step_kind(SamplingOptions(4, sampler="entropy"), AbsorbingGraph(5))
    with pytest.raises(ValueError, match=r"`sampler` 'entropy' needs a model on the absorbing"):
        check_step_kind(SamplingOptions(4, sampler="entropy"), UniformGraph(5))


def exact_engine(cells: int) -> tuple[Engine, torch.Tensor]:
    joint = potts_distribution(10, 2, coupling=2.0)
    model = ExactModel(joint, 10, 2, "x0")
    sampler = Sampler(model, LogLinearNoise(), AbsorbingGraph(2), use_amp=False)
    return Engine(sampler, ModelLimits.of_module(model, 10), max_rows_per_forward=cells), joint


def run_exact(engine: Engine, joint: torch.Tensor, cells: int, **options: object):
    out = {}
    job = EngineJob(cells, SamplingOptions(**options, seed=3))  # type: ignore[arg-type]
    run_jobs(engine, [job], lambda k, result: out.__setitem__(k, result))
    counts = torch.bincount(state_index(out[0].tokens, 2), minlength=len(joint)).double()
    return out[0], 0.5 * float((counts / cells - joint).abs().sum())


def test_at_equal_forwards_the_adaptive_step_is_closer_to_the_exact_law() -> None:
    """On the Potts chain (10 binary genes, strong coupling) at about 4 forwards a cell:
    uniform Euler steps measured TV 0.28 (3.94 forwards a cell), the adaptive step 0.18 (3.74)
    (100,000 cells; sampling noise about 0.01 here at 20,000)."""
    cells = 20_000
    engine, joint = exact_engine(cells)
    uniform, uniform_tv = run_exact(engine, joint, cells, steps=4)
    adaptive, adaptive_tv = run_exact(engine, joint, cells, steps=10, sampler="entropy",
                                      entropy_bound=1.0)  # fmt: skip
    assert adaptive.forwards_per_cell <= uniform.forwards_per_cell  # no more forwards
    assert adaptive_tv < uniform_tv - 0.04, (adaptive_tv, uniform_tv)
    # and every cell is whole: no mask left, none beyond the cap
    assert int(adaptive.tokens.max()) < 2 and adaptive.genes_committed == 10 * cells


def test_a_uniform_graph_model_refuses_the_adaptive_step_in_one_line_at_every_door() -> None:
    from pathlib import Path

    from server_client import make_settings

    import sedd
    from sedd.defaults import OptionError
    from server.errors import FieldError
    from server.intake import plan_body
    from server.schemas import GenerateRequest

    path = Path(__file__).parents[1] / "data" / "sedd_reference" / "uniform" / "hf"
    with pytest.warns(UserWarning):  # the reference models have positional genes
        model = sedd.load(path, precision="fp32")
    needs = r"`sampler` .entropy. needs a model on the absorbing"
    with pytest.raises(OptionError, match=needs) as err:
        model.generate(2, sampler="entropy", progress=False)
    assert err.value.field == "sampler"
    body = GenerateRequest(num_cells=2, sampler="entropy")
    with pytest.raises(FieldError) as refused:
        plan_body(model.loaded, make_settings(path), body)
    assert refused.value.loc == ["body", "sampler"]
