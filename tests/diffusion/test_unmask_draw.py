"""The absorbing step with whole-row, in-place ops draws the same cells as the maths it replaced.

``Sampler._unmask_probs`` takes the softmax over the whole row with the mask's logit at -inf,
scales it in place and hands the stay back apart; ``sample_categorical(..., stay=)`` adds the
stay to the CDF's total instead of writing it into a (b, L, V) column. The reference here is the
maths as written before (sedd 17d05f4): a softmax over a slice of the V - 1 real tokens, a
(b, L, V) buffer with the stay in the mask's column, an fp64 copy and its cumulative sum.
``temper`` now works in place; the reference keeps its old out-of-place form. Tokens must be
equal, not close, in fp32 and bf16, for both parametrisations and predictors, tempered rows,
the final denoise and argmax. The stay is close, not equal: its sum of the jumps comes from the
two-level draw's chunk sums (``sedd.diffusion.categorical``), added in another order.
"""

from __future__ import annotations

import pytest
import torch
from devices import DEVICE, EMULATED, ON_CUDA

from sedd.diffusion.categorical import chunk_sums, sample_categorical, temper
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.randomness import cell_uniforms
from sedd.diffusion.sampling import WHOLE_ROW_SOFTMAX_FROM, Sampler, StepBranches, StepRows
from sedd.diffusion.steps import StepTimes, kinds_in
from sedd.models.ddit import DDiT
from sedd.models.st3 import SEDDTransformer

GENES, ROWS = 12, 5
# the numbers of the CPU's kernels (the emulated lane runs them too); a GPU's softmax and sums
# add in their own order, so there the whole-row softmax may differ in the last bit
cpu_kernels = pytest.mark.skipif(ON_CUDA and not EMULATED, reason="pins the CPU's kernels")


def step_inputs(sampler: Sampler, rows: StepRows) -> tuple[torch.Tensor, ...]:
    """The forward's fp32 output and the noise levels a block step starts from."""
    noise, x = sampler.noise, rows.x
    sigma_t = noise.total_noise(rows.t)
    out = sampler.precision.block_scores(
        sampler.model, x, sigma_t.float(), rows.labels, rows.cell_types
    )
    final = rows.s <= 0
    sigma_s = torch.where(final, 0.0, noise.total_noise(rows.s.clamp_min(0)))
    return out, sigma_t, sigma_s, final


def reference_probs(sampler: Sampler, rows: StepRows) -> torch.Tensor:
    """p(x_s = y | mask) the old way: one (b, L, V) buffer, the stay in the mask's column."""
    out, sigma_t, sigma_s, final = step_inputs(sampler, rows)
    noise, mask = sampler.noise, sampler.graph.dim - 1
    tweedie = final | (rows.kind == 1)
    dsigma = torch.where(final, sigma_t, sigma_t - sigma_s)
    c = torch.where(tweedie, torch.expm1(dsigma), (rows.t - rows.s) * noise.rate_noise(rows.t))
    probs = torch.empty_like(out)  # (b, L, V)
    if sampler.model.parametrisation == "x0":
        scale = (c / torch.expm1(sigma_t)).float()[:, None, None]
        probs[..., :mask] = torch.softmax(out[..., :mask], dim=-1) * scale
        own: torch.Tensor | float = 1.0
    else:
        score = out.exp()
        probs[..., :mask] = score[..., :mask] * c.float()[:, None, None]
        own = torch.where(tweedie[:, None], score[..., mask], 1.0)
    stay = torch.where(final[:, None], 0.0, own - probs[..., :mask].sum(dim=-1)).clamp_min(0)
    probs[..., mask] = stay
    return probs


def reference_temper(
    probs: torch.Tensor, current: torch.Tensor, temp: torch.Tensor
) -> torch.Tensor:
    """Temperature the old way: every step a new (b, L, V) tensor."""
    here = current[..., None]
    jump = probs.clamp_min(0).scatter(-1, here, 0.0)
    mass = jump.sum(dim=-1, keepdim=True)
    log_jump = jump.clamp_min(torch.finfo(jump.dtype).tiny).log() / temp
    tempered = torch.softmax(log_jump.masked_fill(jump <= 0, -torch.inf), dim=-1)
    tempered = torch.nan_to_num(tempered, nan=0.0) * mass
    return tempered.scatter(-1, here, probs.gather(-1, here).clamp_min(0))


def reference_tokens(sampler: Sampler, rows: StepRows) -> torch.Tensor:
    """The absorbing block step's tokens the old way: temper, then one fp64 CDF over V."""
    x, mask, final = rows.x, sampler.graph.dim - 1, rows.s <= 0
    probs = reference_probs(sampler, rows)
    temp = rows.temperature[:, None, None]
    probs = torch.where(temp != 1, reference_temper(probs, torch.full_like(x, mask), temp), probs)
    uniforms = cell_uniforms(rows.seed, rows.cell, rows.step, x.shape[1]).flatten()
    cdf = probs.flatten(0, 1).double().cumsum(dim=-1)  # every entry >= 0
    total = cdf[:, -1:]
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, 0 * total))
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(mask).view_as(x)
    if sampler.denoise_mode == "argmax":
        drawn = torch.where(final[:, None], probs.argmax(dim=-1), drawn)
    return torch.where(sampler.graph.active_positions(x), drawn, x)


def loud(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """Random weights large enough for logits of a few units (probabilities over decades)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval().to(DEVICE)


def models(vocab: int) -> dict[str, torch.nn.Module]:
    return {
        "x0": loud(SEDDTransformer(GENES, vocab - 1, 32, 1, 2), 0.2),
        "score": loud(DDiT(vocab, 32, 16, 1, 2, GENES, "absorb", dropout=0.0), 0.3),
    }


def rows_at(t: float, s: float, vocab: int, analytic: bool) -> StepRows:
    gen = torch.Generator().manual_seed(int(t * 100))
    x = torch.full((ROWS, GENES), vocab - 1)
    if t < 1:  # about half the genes drawn already
        drawn = torch.randint(0, vocab - 1, (ROWS, GENES), generator=gen)
        x = torch.where(torch.rand(ROWS, GENES, generator=gen) < 0.5, drawn, x)
    temperature = torch.tensor([0.5, 1.0, 1.7, 1.0, 0.8])
    return StepRows.of_request(x.to(DEVICE), t, s, seed=11, step=3,
                               temperature=temperature.to(DEVICE), kind=int(analytic))  # fmt: skip


@cpu_kernels
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("vocab", [8, 17, 65, 66, 130])  # short rows and whole rows
def test_unmask_step_draws_the_cells_of_the_old_maths_bit_for_bit(vocab: int, precision: str):
    for name, model in models(vocab).items():
        for analytic in (False, True):
            for t, s in ((1.0, 0.9), (0.5, 0.3), (0.02, 0.0)):  # the last: the final denoise
                for denoise in ("sample", "argmax"):
                    sampler = Sampler(
                        model, LogLinearNoise(), AbsorbingGraph(vocab - 1), device=DEVICE,
                        use_amp=precision == "bf16", denoise=denoise, block_rows=ROWS,
                    )  # fmt: skip
                    rows = rows_at(t, s, vocab, analytic)
                    where = f"{name} V={vocab} analytic={analytic} t={t} {denoise}"
                    old = reference_probs(sampler, rows)
                    out, sigma_t, sigma_s, final = step_inputs(sampler, rows)
                    times = StepTimes(rows, sigma_t, sigma_s, final, sampler.noise)
                    kinds = kinds_in(StepBranches.of_rows(rows))
                    jumps, stay, sums = sampler._unmask_probs(out, times, kinds)
                    assert torch.equal(jumps[..., :-1], old[..., :-1]), where
                    assert not jumps[..., -1].any(), where
                    # the stay is 1 - (sum of the chunk sums): the old row sum's value, up to
                    # fp32 addition order
                    assert torch.allclose(stay, old[..., -1], rtol=1e-5, atol=1e-6), where
                    assert torch.equal(sums, chunk_sums(jumps.flatten(0, 1)).view_as(sums))
                    mask, temp = torch.full_like(rows.x, vocab - 1), rows.temperature[:, None, None]
                    tempered = reference_temper(old, mask, temp)
                    assert torch.equal(temper(jumps, mask, temp)[..., :-1], tempered[..., :-1])
                    new = sampler.step(rows, StepBranches()).tokens
                    assert torch.equal(new, reference_tokens(sampler, rows)), where
                    assert (new != rows.x).any(), where  # the step did draw


@cpu_kernels
@pytest.mark.parametrize("vocab", [*range(WHOLE_ROW_SOFTMAX_FROM + 1, 140), 256, 257, 1025, 1725])
def test_softmax_with_the_mask_at_minus_inf_equals_the_softmax_of_the_real_tokens(vocab: int):
    gen = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(64, vocab, generator=gen) * 12).to(DEVICE)
    expected = torch.softmax(logits[:, :-1], dim=-1)  # a strided slice, copied by softmax
    whole = torch.softmax(logits.index_fill(-1, torch.tensor([vocab - 1], device=DEVICE),
                                            -torch.inf), dim=-1)  # fmt: skip
    assert torch.equal(whole[:, :-1], expected)
    assert torch.equal(whole[:, -1], torch.zeros(64, device=DEVICE))


def test_a_stay_given_apart_draws_as_the_stay_in_the_last_column():
    gen = torch.Generator().manual_seed(0)
    m, v = 4000, 9
    jumps = torch.rand(m, v, generator=gen) ** 8 * (torch.rand(m, v, generator=gen) < 0.7)
    jumps[:, -1] = 0
    stay = torch.rand(m, generator=gen) * (torch.rand(m, generator=gen) < 0.8)
    jumps[:50], stay[:25] = 0, 0  # rows with nothing to draw: the last category
    uniforms = torch.rand(m, generator=gen, dtype=torch.float64)
    uniforms[::7] = 0.0
    uniforms[::11] = 1 - 2**-53
    full = jumps.clone()
    full[:, -1] = stay
    expected = sample_categorical(full, uniforms, nonnegative=True)
    drawn = sample_categorical(jumps, uniforms, nonnegative=True, stay=stay)
    assert torch.equal(drawn, expected)
    assert set(drawn[:25].tolist()) == {v - 1} and (drawn == v - 1).any() and (drawn < 2).any()
