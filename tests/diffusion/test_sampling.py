"""Sampler behaviour: unmasking schedule, seeding, conditioning, imputation, hooks, errors."""

from __future__ import annotations

import math

import pytest
import torch
from exact_models import ExactModel, potts_distribution
from torch import nn

from sedd.diffusion.graph import AbsorbingGraph, UniformGraph
from sedd.diffusion.noise import GeometricNoise, LogLinearNoise
from sedd.diffusion.sampling import Sampler, StepRows, start_tokens
from sedd.diffusion.st3_samplers import AnalyticSampler, EulerSampler, PerturbationEulerSampler
from sedd.engine import StepProgress
from sedd.models.ddit import DDiT
from sedd.models.st3 import SEDDPerturbationTransformer, SEDDTransformer


class FlatX0Model(nn.Module):
    """x0 model with the same clean-token logits everywhere; optionally a loud mask logit."""

    parametrisation = "x0"

    def __init__(self, num_genes: int, num_bins: int, mask_logit: float = 0.0) -> None:
        super().__init__()
        self.num_genes, self.vocab_size, self.mask_index = num_genes, num_bins + 1, num_bins
        self.mask_logit = mask_logit

    def forward(self, x, sigma, labels=None, cell_types=None):
        logits = torch.zeros(*x.shape, self.vocab_size)
        logits[..., self.mask_index] = self.mask_logit
        return logits


class LabelCopyModel(FlatX0Model):
    """Puts almost all mass on token ``label`` (+ ``cell_type``): conditioning must reach it."""

    def forward(self, x, sigma, labels=None, cell_types=None):
        if labels is None:
            raise ValueError("labels are required")
        logits = torch.full((*x.shape, self.vocab_size), -30.0)
        target = labels + (0 if cell_types is None else cell_types)
        logits.scatter_(-1, target[:, None, None].expand(*x.shape, 1), 30.0)
        return logits


def unmasked_fraction_after_each_step(sampler: Sampler, steps: int, cells: int, genes: int):
    fractions: list[float] = []
    sampler.sample(
        cells,
        num_genes=genes,
        steps=steps,
        seed=0,
        on_step=lambda st: fractions.append(1 - st.fraction_masked),
    )
    return fractions


@pytest.mark.parametrize("sampler_cls", [EulerSampler, AnalyticSampler])
def test_first_step_unmasks_about_one_over_n(sampler_cls):
    steps, cells, genes = 20, 4, 5000
    sampler = sampler_cls(
        FlatX0Model(genes, 10), LogLinearNoise(), AbsorbingGraph(10), use_amp=False
    )
    fractions = unmasked_fraction_after_each_step(sampler, steps, cells, genes)
    n = cells * genes
    for k, frac in enumerate(fractions[:steps], start=1):
        # positions are unmasked independently: after k steps, Binomial(n, k (1 - eps) / N)
        p = k * (1 - 1e-5) / steps
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-9, (k, frac, p)
    assert fractions[-1] == 1.0  # the final denoise leaves no mask
    # st3's step would have unmasked 1 - exp(-sigma'(1) dt) of them at once:
    st3_first = 1 - math.exp(-(1 - 1e-3) / (1 - (1 - 1e-3)) / steps)
    assert st3_first > 0.999 and fractions[0] < 0.06


def test_score_model_unmasks_at_the_same_rate():
    # A reference DDiT (score parametrisation, random weights) carries 1/(e^sigma - 1) itself.
    torch.manual_seed(0)
    model = DDiT(
        vocab_size=9, hidden_size=32, cond_dim=16, n_blocks=1, n_heads=2, length=512, graph="absorb"
    ).eval()
    sampler = EulerSampler(model, LogLinearNoise(), AbsorbingGraph(8), use_amp=False)
    fractions: list[float] = []
    sampler.sample(
        8,
        num_genes=512,
        steps=10,
        seed=1,
        on_step=lambda st: fractions.append(1 - st.fraction_masked),
    )
    n = 8 * 512
    for k in (1, 5, 9):
        p = k / 10
        assert abs(fractions[k - 1] - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_same_seed_same_cells_different_seed_different_cells():
    sampler = EulerSampler(
        ExactModel(potts_distribution(5, 3, 2.0), 5, 3, "x0"),
        LogLinearNoise(),
        AbsorbingGraph(3),
        use_amp=False,
    )
    a = sampler.sample(64, steps=8, seed=11)
    b = sampler.sample(64, steps=8, seed=11)
    c = sampler.sample(64, steps=8, seed=12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_cell_depends_only_on_seed_and_index_not_batch():
    sampler = EulerSampler(
        ExactModel(potts_distribution(5, 3, 2.0), 5, 3, "x0"),
        LogLinearNoise(),
        AbsorbingGraph(3),
        use_amp=False,
    )
    whole = sampler.sample(12, steps=6, seed=3)
    tail = sampler.sample(5, steps=6, seed=3, first_cell=7)
    assert torch.equal(whole[7:], tail)


def test_mask_token_is_never_drawn_even_when_the_model_prefers_it():
    model = FlatX0Model(64, 5, mask_logit=50.0)
    for cls in (EulerSampler, AnalyticSampler):
        out = cls(model, LogLinearNoise(), AbsorbingGraph(5), use_amp=False).sample(
            16, steps=4, seed=0
        )
        assert int(out.max()) <= 4 and int(out.min()) >= 0


def test_argmax_denoise_and_without_denoise():
    model = FlatX0Model(32, 5)
    sampler = EulerSampler(
        model, LogLinearNoise(), AbsorbingGraph(5), use_amp=False, denoise="argmax"
    )
    out = sampler.sample(4, steps=3, seed=0)
    assert int(out.max()) < 5
    raw = sampler.sample(4, steps=3, seed=0, denoise=False, eps=0.5)
    assert (raw == 5).any()  # stopping at t = 0.5 leaves masks when not denoising


def test_conditioning_reaches_the_model():
    model = LabelCopyModel(16, 10)
    sampler = PerturbationEulerSampler(model, LogLinearNoise(), AbsorbingGraph(10), use_amp=False)
    labels = torch.tensor([0, 3, 7])
    out = sampler.sample(labels, steps=4, seed=0)
    assert torch.equal(out, labels[:, None].expand(3, 16))
    out = sampler.sample(labels, steps=4, seed=0, cell_types=torch.tensor([1, 1, 2]))
    assert torch.equal(out, torch.tensor([1, 4, 9])[:, None].expand(3, 16))
    with pytest.raises(ValueError, match="labels"):
        sampler.sample(None, steps=4, seed=0)


def test_st3_models_sample_with_index_vector_and_cell_type_conditioning():
    torch.manual_seed(0)
    plain = SEDDTransformer(num_genes=24, num_bins=7, hidden_dim=32, num_layers=1, num_heads=2)
    out = EulerSampler(plain.eval(), LogLinearNoise(), AbsorbingGraph(7)).sample(3, steps=5, seed=0)
    assert out.shape == (3, 24) and int(out.max()) < 7
    pert = SEDDPerturbationTransformer(
        num_genes=24,
        num_bins=7,
        num_perturbations=4,
        hidden_dim=32,
        num_layers=1,
        num_heads=2,
        precomputed_emb_dim=6,
        num_cell_types=2,
    ).eval()
    sampler = PerturbationEulerSampler(pert, LogLinearNoise(), AbsorbingGraph(7))
    by_index = sampler.sample(
        torch.tensor([0, 1, 2]), steps=5, seed=0, cell_types=torch.tensor([0, 1, 1])
    )
    by_vector = sampler.sample(torch.randn(3, 6), steps=5, seed=0)
    for out in (by_index, by_vector):
        assert out.shape == (3, 24) and int(out.max()) < 7 and int(out.min()) >= 0


def test_uniform_graph_score_model_samples_every_position():
    torch.manual_seed(0)
    model = DDiT(
        vocab_size=6,
        hidden_size=32,
        cond_dim=16,
        n_blocks=1,
        n_heads=2,
        length=16,
        graph="uniform",
        scale_by_sigma=False,
    ).eval()
    for cls in (EulerSampler, AnalyticSampler):
        sampler = cls(model, GeometricNoise(1e-4, 20.0), UniformGraph(6), use_amp=False)
        out = sampler.sample(4, num_genes=16, steps=6, seed=0)
        assert out.shape == (4, 16) and int(out.max()) < 6
    x_init = torch.randint(0, 6, (2, 16))
    fixed = torch.zeros_like(x_init, dtype=torch.bool)
    fixed[:, :5] = True
    out = EulerSampler(model, GeometricNoise(1e-4, 20.0), UniformGraph(6), use_amp=False).sample(
        steps=4, x_init=x_init, fixed=fixed, seed=0
    )
    assert torch.equal(out[:, :5], x_init[:, :5])


def test_uniform_graph_start_comes_from_the_seed_not_the_global_rng():
    torch.manual_seed(0)
    model = DDiT(
        vocab_size=6, hidden_size=32, cond_dim=16, n_blocks=1, n_heads=2, length=16,
        graph="uniform", scale_by_sigma=False,
    ).eval()  # fmt: skip
    sampler = EulerSampler(model, GeometricNoise(1e-4, 20.0), UniformGraph(6), use_amp=False)
    start = start_tokens(UniformGraph(6), 4, 16, seed=3)
    assert start.shape == (4, 16) and len(start.unique()) > 1
    torch.manual_seed(123)
    whole = sampler.sample(4, num_genes=16, steps=3, seed=3)
    torch.manual_seed(456)  # a different global RNG state changes nothing
    again = sampler.sample(4, num_genes=16, steps=3, seed=3)
    later = sampler.sample(2, num_genes=16, steps=3, seed=3, first_cell=2)  # cells 2, 3 alone
    assert torch.equal(whole, again)
    assert torch.equal(whole[2:], later)
    assert torch.equal(start[2:], start_tokens(UniformGraph(6), 2, 16, seed=3, first_cell=2))
    assert not torch.equal(start, start_tokens(UniformGraph(6), 4, 16, seed=4))


def test_progress_hook_reports_every_step_the_denoise_included():
    stats: list[StepProgress] = []
    sampler = EulerSampler(FlatX0Model(100, 4), LogLinearNoise(), AbsorbingGraph(4), use_amp=False)
    sampler.sample(2, steps=5, seed=0, on_step=stats.append)
    assert [s.step for s in stats] == [1, 2, 3, 4, 5, 6]
    assert all(s.rows == 2 and s.steps == 6 for s in stats)
    masked = [s.fraction_masked for s in stats]
    assert masked == sorted(masked, reverse=True) and masked[-1] == 0.0
    assert 0.7 < masked[0] < 0.9  # the first of 5 uniform steps unmasks about 1/5


def test_step_accepts_per_row_times_and_denoises_rows_at_s_zero():
    sampler = EulerSampler(FlatX0Model(50, 4), LogLinearNoise(), AbsorbingGraph(4), use_amp=False)
    x = torch.full((2, 50), 4)
    t = torch.tensor([1.0, 0.5], dtype=torch.float64)
    s = torch.tensor([0.9, 0.0], dtype=torch.float64)
    out = sampler.step(StepRows.of_request(x, t, s)).tokens
    assert (out[1] != 4).all()  # row 1 denoised completely
    assert 0 < (out[0] != 4).sum() < 25  # row 0 unmasked ~10%


def test_bad_arguments_get_clear_errors():
    model = FlatX0Model(8, 4)
    with pytest.raises(ValueError, match="vocab_size 5 does not match graph dim 6"):
        EulerSampler(model, LogLinearNoise(), AbsorbingGraph(5))
    with pytest.raises(ValueError, match="needs the absorbing graph"):
        EulerSampler(model, LogLinearNoise(), UniformGraph(5))
    sampler = EulerSampler(model, LogLinearNoise(), AbsorbingGraph(4), use_amp=False)
    with pytest.raises(ValueError, match="`steps` must be >= 1, got 0"):
        sampler.sample(2, steps=0, seed=0)
    with pytest.raises(ValueError, match="`temperature` must be finite"):
        sampler.sample(2, steps=2, seed=0, temperature=0.0)
    with pytest.raises(ValueError, match=r"`seed` must be in \[0, 2\*\*63 - 1\], got -1"):
        sampler.sample(2, steps=2, seed=-1)
    with pytest.raises(ValueError, match=r"`first_cell` must be in \[0, 2\*\*48 - num_cells\]"):
        sampler.sample(2, steps=2, seed=0, first_cell=2**48 - 1)
    with pytest.raises(ValueError, match="`num_cells` must be >= 1, got 0"):
        sampler.sample(0, steps=2, seed=0)
    x_init = torch.full((1, 8), 4)
    with pytest.raises(ValueError, match="`fixed` must be over real tokens, never the mask"):
        sampler.sample(steps=2, seed=0, x_init=x_init, fixed=torch.ones(1, 8, dtype=torch.bool))
