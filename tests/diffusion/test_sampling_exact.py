"""Samplers against an exactly known joint distribution (5 positions x 3 tokens, strong coupling).

The bound on total variation between the empirical law of n samples and the truth:

    TV <= 0.5 * sum_k sqrt(p_k (1 - p_k) / n)      (expected TV of an empirical law)
        + sqrt(log(1 / delta) / (2 n))              (McDiarmid: each sample moves TV by <= 1/n)
        + (1 - P(no two positions unmask in one step))   (the sampler's own law; exact otherwise)
        + bf16 slack (bf16 runs only)

One-shot sampling (all positions from the all-mask prediction, as st3's sampler effectively
does) must fail the same bound.
"""

from __future__ import annotations

import math

import pytest
import torch
from exact_models import ExactModel, no_collision_probability, potts_distribution, state_index

from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.st3_samplers import AnalyticSampler, EulerSampler

POSITIONS, TOKENS = 5, 3
SAMPLES, STEPS, EPS = 10_000, 256, 1e-5
DELTA = 1e-6
# bf16 rounds the model's log-probabilities (|log p| <= ~8 here) to 8 mantissa bits: a relative
# probability error of at most ~8 * 2^-9 per conditional, i.e. TV <= 0.5 * 5 * 0.016 over the
# five sequential draws.
BF16_SLACK = 0.04

JOINT = potts_distribution(POSITIONS, TOKENS, coupling=2.0)
SAMPLERS = {"euler": EulerSampler, "analytic": AnalyticSampler}


def tv_bound(joint: torch.Tensor, n: int, steps: int | None, bf16: bool) -> float:
    """The bound above; ``steps=None`` for a law sampled exactly (no discretisation term)."""
    expected = 0.5 * float(torch.sqrt(joint * (1 - joint) / n).sum())
    deviation = math.sqrt(math.log(1 / DELTA) / (2 * n))
    discretisation = 0.0 if steps is None else 1 - no_collision_probability(POSITIONS, steps, EPS)
    return expected + deviation + discretisation + (BF16_SLACK if bf16 else 0.0)


def empirical_tv(samples: torch.Tensor, joint: torch.Tensor) -> float:
    counts = torch.bincount(state_index(samples, TOKENS), minlength=joint.numel()).double()
    return 0.5 * float((counts / counts.sum() - joint).abs().sum())


def draw(
    predictor: str, parametrisation: str, precision: str, steps: int, seed: int = 0
) -> torch.Tensor:
    model = ExactModel(JOINT, POSITIONS, TOKENS, parametrisation)
    sampler = SAMPLERS[predictor](
        model,
        LogLinearNoise(),
        AbsorbingGraph(TOKENS),
        use_amp=precision == "bf16",
        amp_dtype=torch.bfloat16,
    )
    return sampler.sample(SAMPLES, steps=steps, seed=seed, eps=EPS)


# the bf16 half of the matrix is CI's slow step (the README's command runs the fp32 half)
@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("parametrisation", ["x0", "score"])
@pytest.mark.parametrize("predictor", ["euler", "analytic"])
def test_sampler_matches_exact_joint(predictor: str, parametrisation: str, precision: str):
    samples = draw(predictor, parametrisation, precision, STEPS)
    assert samples.shape == (SAMPLES, POSITIONS)
    assert int(samples.max()) < TOKENS  # the mask is never emitted
    bound = tv_bound(JOINT, SAMPLES, STEPS, precision == "bf16")
    tv = empirical_tv(samples, JOINT)
    print(f"{predictor}/{parametrisation}/{precision}: TV {tv:.4f} < bound {bound:.4f}")
    assert tv < bound, f"TV {tv:.4f} exceeds bound {bound:.4f}"


@pytest.mark.parametrize("parametrisation", ["x0", "score"])
def test_one_shot_sampling_fails_the_same_bound(parametrisation: str):
    # steps=1: every position is drawn independently from the all-mask prediction.
    samples = draw("euler", parametrisation, "fp32", steps=1)
    bound = tv_bound(JOINT, SAMPLES, STEPS, bf16=True)  # the loosest bound the tests above use
    tv = empirical_tv(samples, JOINT)
    print(f"one-shot/{parametrisation}: TV {tv:.4f} > bound {bound:.4f}")
    assert tv > bound, f"one-shot TV {tv:.4f} should exceed {bound:.4f}"
    # and it matches the product of marginals it actually samples from
    marginal_product = torch.ones(1, dtype=torch.float64)
    states = torch.cartesian_prod(*[torch.arange(TOKENS)] * POSITIONS)
    for i in range(POSITIONS):
        marg = torch.bincount(states[:, i], weights=JOINT, minlength=TOKENS)
        marginal_product = marginal_product * marg[states[:, i]]
    assert empirical_tv(samples, marginal_product) < tv_bound(
        marginal_product, SAMPLES, None, bf16=False
    )


def test_imputation_samples_the_exact_conditional():
    # Fix position 0 to token 2: the rest must follow p(x_1..x_4 | x_0 = 2).
    model = ExactModel(JOINT, POSITIONS, TOKENS, "x0")
    sampler = EulerSampler(model, LogLinearNoise(), AbsorbingGraph(TOKENS), use_amp=False)
    x_init = torch.full((SAMPLES, POSITIONS), TOKENS)
    x_init[:, 0] = 2
    fixed = torch.zeros_like(x_init, dtype=torch.bool)
    fixed[:, 0] = True
    samples = sampler.sample(steps=STEPS, x_init=x_init, fixed=fixed, seed=3, eps=EPS)
    assert bool((samples[:, 0] == 2).all())
    states = torch.cartesian_prod(*[torch.arange(TOKENS)] * POSITIONS)
    conditional = torch.where(states[:, 0] == 2, JOINT, 0.0)
    conditional = conditional / conditional.sum()
    tv = empirical_tv(samples, conditional)
    assert tv < tv_bound(conditional, SAMPLES, STEPS, bf16=False)


def test_temperature_tempers_the_clean_token_distribution():
    joint = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    model = ExactModel(joint, 1, 3, "x0")
    sampler = EulerSampler(model, LogLinearNoise(), AbsorbingGraph(3), use_amp=False)
    for temperature in (0.5, 2.0):
        samples = sampler.sample(SAMPLES, steps=4, temperature=temperature, seed=1)
        tempered = torch.softmax(joint.log() / temperature, dim=0)
        counts = torch.bincount(samples[:, 0], minlength=3).double() / SAMPLES
        assert torch.allclose(counts, tempered, atol=0.015), (temperature, counts, tempered)


def draw_adaptive(parametrisation: str, precision: str, bound: float) -> torch.Tensor:
    """The entropy-bounded sampler through the reference loop, its cap one gene a forward."""
    from sedd.defaults import SamplingOptions
    from sedd.diffusion.reference import reference_sample
    from sedd.diffusion.sampling import Sampler

    model = ExactModel(JOINT, POSITIONS, TOKENS, parametrisation)
    sampler = Sampler(model, LogLinearNoise(), AbsorbingGraph(TOKENS),
                      use_amp=precision == "bf16", amp_dtype=torch.bfloat16)  # fmt: skip
    options = SamplingOptions(POSITIONS, sampler="entropy", entropy_bound=bound)
    return reference_sample(sampler, None, options, num_cells=SAMPLES, num_genes=POSITIONS)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("parametrisation", ["x0", "score"])
def test_the_adaptive_sampler_at_bound_zero_draws_the_exact_joint(
    parametrisation: str, precision: str
):
    """At gamma = 0 one gene is committed a forward, drawn from its exact conditional: the law
    is exact (no discretisation term), whatever the order the genes are drawn in."""
    samples = draw_adaptive(parametrisation, precision, 0.0)
    assert int(samples.max()) < TOKENS
    bound = tv_bound(JOINT, SAMPLES, None, precision == "bf16")
    tv = empirical_tv(samples, JOINT)
    print(f"entropy/{parametrisation}/{precision}: TV {tv:.4f} < bound {bound:.4f}")
    assert tv < bound


def test_the_adaptive_sampler_converges_to_the_exact_joint_as_its_bound_shrinks():
    """A bound past every gene's entropy draws them all at once (one-shot: far off); as it
    shrinks the TV falls to within the exact law's bound."""
    exact = tv_bound(JOINT, SAMPLES, None, bf16=False)
    tvs = {b: empirical_tv(draw_adaptive("x0", "fp32", b), JOINT) for b in (100.0, 1.0, 0.0)}
    print(f"entropy/x0: TV by bound {tvs}")
    assert tvs[100.0] > exact  # one-shot
    assert tvs[100.0] > tvs[1.0] > tvs[0.0] and tvs[0.0] < exact
