"""``sample_categorical`` searches its fp64 CDF in two levels (chunk sums, then one chunk), so no
(M, V) fp64 tensor is written. These tests pin what that must keep from a full-row fp64 inverse
CDF: the same categories for the same uniforms (up to rounding at a boundary), every category's
rate however small (precision rule 4), and never a zero-probability category."""

from __future__ import annotations

import pytest
import torch

from sedd.diffusion.categorical import chunk_sums, chunk_width, sample_categorical


def full_row_draw(probs: torch.Tensor, uniforms: torch.Tensor, stay: torch.Tensor | None = None):
    """The plain inverse CDF: one fp64 cumulative sum over the whole row, then a search."""
    cdf = probs.clamp_min(0).double().cumsum(dim=-1)
    total = cdf[:, -1:] if stay is None else cdf[:, -1:] + stay.clamp_min(0)[:, None].double()
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros(1)))
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return drawn.clamp_max(probs.shape[-1] - 1)


def random_rows(gen: torch.Generator, m: int, v: int, spread: float) -> torch.Tensor:
    """Softmax rows of logits with scale ``spread`` (large: a few categories hold the mass, the
    rest are far below 1e-9), with 30% of the entries set to 0."""
    probs = torch.softmax(torch.randn(m, v, generator=gen) * spread, dim=-1)
    return probs.masked_fill_(torch.rand(m, v, generator=gen) < 0.3, 0.0)


@pytest.mark.parametrize("v", [2, 3, 17, 261, 1725])
def test_the_same_category_as_a_full_row_cdf(v: int) -> None:
    gen = torch.Generator().manual_seed(v)
    for spread, with_stay in ((1.0, False), (8.0, True), (30.0, False)):
        probs = random_rows(gen, 4000, v, spread)
        stay = None
        if with_stay:
            probs[:, -1] = 0
            stay = torch.rand(4000, generator=gen) * (torch.rand(4000, generator=gen) < 0.8)
        uniforms = torch.rand(4000, generator=gen, dtype=torch.float64)
        uniforms[:4] = torch.tensor([0.0, 1 - 2**-53, 0.5, 1e-300], dtype=torch.float64)
        drawn = sample_categorical(probs, uniforms, nonnegative=True, stay=stay)
        assert torch.equal(drawn, full_row_draw(probs, uniforms, stay)), (v, spread)
        # negatives count as 0, as in the full row
        shifted = probs - 1e-3
        drawn = sample_categorical(shifted, uniforms, stay=stay)
        assert torch.equal(drawn, full_row_draw(shifted, uniforms, stay)), (v, spread)


def lowest_uniform_drawing_at_least(probs: torch.Tensor, stay: torch.Tensor) -> torch.Tensor:
    """For one row (V,) and each category k: the smallest fp64 uniform whose draw is >= k, by
    bisection over all k at once (the draw is non-decreasing in the uniform)."""
    v = probs.shape[0]
    rows, stays = probs.expand(v, v), stay.expand(v)
    k = torch.arange(v)
    lo = torch.zeros(v, dtype=torch.float64)
    hi = torch.ones(v, dtype=torch.float64)
    for _ in range(80):
        mid = (lo + hi) / 2
        at_least = sample_categorical(rows, mid, nonnegative=True, stay=stays) >= k
        hi, lo = torch.where(at_least, mid, hi), torch.where(at_least, lo, mid)
    return hi


def test_every_category_keeps_its_rate_however_small() -> None:
    """Each category's interval of uniforms is its share of the total, relative error below
    1e-5 (1e-3 at 1e-12, where the fp64 uniform's own grid is 1e-4 of it): rounding of a
    chunk's sum scales its categories together, it never swamps a small one."""
    gen = torch.Generator().manual_seed(4)
    v = 261  # chunks of 17
    probs = (torch.rand(v, generator=gen) + 0.5) / v  # a total near 1
    tiny = {20: 1e-9, 40: 1e-12, 41: 3e-8, 255: 1e-9}  # inside chunks, among large entries
    for k, p in tiny.items():
        probs[k] = p
    probs[-1] = 0  # the stay's column, given apart
    stay = torch.tensor(0.25)
    starts = lowest_uniform_drawing_at_least(probs, stay)
    widths = torch.diff(starts, append=torch.ones(1, dtype=torch.float64))
    rates = probs.double().clone()
    rates[-1] = stay
    rates /= rates.sum()
    relative = (widths - rates).abs() / rates
    for k in range(v):
        assert relative[k] < (1e-3 if k == 40 else 1e-5), (k, rates[k].item(), widths[k].item())


def test_no_zero_probability_category_even_at_the_edges() -> None:
    gen = torch.Generator().manual_seed(1)
    m, v = 20_000, 261
    probs = random_rows(gen, m, v, 20.0)
    probs[: m // 2, chunk_width(v) :] = 0  # mass in the first chunk only
    probs[m // 2 :, -5:] = 1e-30  # a tail of tiny entries at the end of the row
    uniforms = torch.rand(m, generator=gen, dtype=torch.float64)
    uniforms[::3] = 1 - 2**-53
    drawn = sample_categorical(probs, uniforms, nonnegative=True)
    assert (probs.gather(1, drawn[:, None]) > 0).all()
    nothing = torch.zeros(3, v)  # no weight at all: the last category, as a full row gives
    assert sample_categorical(nothing, torch.rand(3, dtype=torch.float64)).tolist() == [v - 1] * 3


@pytest.mark.parametrize("v", [1, 2, 16, 17, 1725])
def test_chunk_sums_cover_the_row_once(v: int) -> None:
    probs = torch.rand(5, v, generator=torch.Generator().manual_seed(v), dtype=torch.float64)
    sums = chunk_sums(probs)
    assert sums.shape == (5, -(-v // chunk_width(v)))
    width = chunk_width(v)
    for c in range(sums.shape[1]):
        assert torch.allclose(sums[:, c], probs[:, c * width : (c + 1) * width].sum(dim=1))
