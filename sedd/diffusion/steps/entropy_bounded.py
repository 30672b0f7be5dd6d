"""Entropy-bounded adaptive unmasking (EB-Sampler, Ben-Hamu et al. 2025, arXiv 2505.24857).

Each step commits, per cell, as many of its masked genes as an entropy budget allows: the masked
genes are taken in a random order, and join while the entropies of the model's predictive
distributions of those taken, less the largest of them, sum to at most the bound gamma (so the
first always joins). That sum bounds the total correlation of the genes drawn together, i.e. how
far drawing them at once is from drawing them one after the other. At least
``ceil(masked / forwards left)`` genes join, so a cell never takes more forwards than its cap
(the request's ``steps``). A cell whose genes the model is sure of commits many a forward and
finishes early; an uncertain one takes more forwards.

The order is uniformly random, from the cell's own stream, as the masks the model was trained on
are. EB-Sampler orders genes by entropy (the surest first); on the bundled model that order
(with a 0.5-nat jitter) made cells with 18% fewer counts and twice the energy distance to real
cells at 8 forwards a cell
(the model sees masks it never saw in training: every sure gene, mostly zeros, drawn first), and
on the exact Potts chain of ``scripts/sampler_study.py oracle`` it was worse than uniform steps
at equal forwards (TV 0.59 against 0.28 at 4 forwards a cell), where the random order is better
(docs/quality.md).

Each chosen gene is drawn from the model's distribution (with the cell's own uniform: never an
argmax, so cells keep their variety), the others stay masked. Every decision reads only the
cell's own row and stream, so a cell depends on (seed, i) alone, never on its batch.

The time a row is at comes from its own state, not a grid: the t at which the noise masks the
fraction of genes that are masked now (``Noise.time_of_mask_fraction``). At gamma -> 0 one gene
is committed a forward, drawn from the model's exact conditional: the sampler then draws from
the model's joint law exactly (``tests/diffusion/test_sampling_exact.py``).
"""

from __future__ import annotations

import torch

from sedd.diffusion.graph import Graph
from sedd.diffusion.noise import Noise
from sedd.diffusion.randomness import Purpose, cell_uniforms
from sedd.diffusion.step_rows import StepRows
from sedd.diffusion.steps.base import ReverseStep, StepTimes

# below it a row's time is clamped (a row with nothing masked is never stepped; its t only
# has to keep the x0 scale finite)
MIN_TIME = 1e-5


class EntropyBoundedStep(ReverseStep):
    """Commits each cell's masked genes, in a random order, up to an entropy budget."""

    name = "entropy"
    absorbing_only = True
    commits = True
    adaptive = True

    def forwards(self, steps: int, denoise: bool) -> int:
        """``steps`` is the cap: the last forward commits every gene still masked."""
        return steps

    def row_time(self, x: torch.Tensor, graph: Graph, noise: Noise) -> torch.Tensor:
        masked = (x == graph.dim - 1).sum(dim=1).double() / max(x.shape[1], 1)  # (b,)
        return noise.time_of_mask_fraction(masked).clamp(MIN_TIME, 1.0)

    def unmask_coefficient(self, times: StepTimes) -> torch.Tensor:
        # p(y) = c s_y: with c = e^sigma - 1 an x0 model's jumps are p(x_0 = y | x_t) itself;
        # a committed gene has no stay, so the scale cancels in the draw anyway
        return torch.expm1(times.sigma_t)

    def transition(
        self, times: StepTimes, score: torch.Tensor, current: torch.Tensor, graph: Graph
    ) -> torch.Tensor:
        raise ValueError("the entropy-bounded step needs the absorbing graph.")

    def choose(self, probs: torch.Tensor, stay: torch.Tensor, active: torch.Tensor,
               rows: StepRows) -> torch.Tensor:  # fmt: skip
        """(b, L) bool: per row, the active positions (in the row's random order) that fit the
        bound, at least the floor that keeps the row within its cap, at most every active one."""
        # the entropy of p = probs / mass (what a chosen gene is drawn from) without writing p:
        # H = log(mass) - sum(probs log probs) / mass, one (b, L, V) temporary (xlogy's), so a
        # block's peak memory stays within the step's per-token budget (``forwards``)
        mass = probs.sum(dim=-1).clamp_min(torch.finfo(probs.dtype).tiny)  # (b, L)
        plogp = torch.special.xlogy(probs, probs).sum(dim=-1)  # (b, L)
        entropy = (mass.log() - plogp / mass).double().clamp_min(0)  # (b, L) nats
        # precision: the running sums in fp64. The order: uniformly random from the cell's own
        # stream, its masked genes first (see the module docstring)
        draw = cell_uniforms(rows.seed, rows.cell, rows.step, active.shape[1], Purpose.ORDER)
        order = torch.where(active, draw, 2.0).argsort(dim=1, stable=True)  # (b, L)
        ordered = entropy.gather(1, order)
        ordered_active = active.gather(1, order)
        taken = torch.where(ordered_active, ordered, 0.0)
        # a prefix's entropies summed, less the largest: the bound on how far drawing them
        # together is from drawing them one by one (their total correlation); it never falls
        # as the prefix grows, so the genes that fit are a prefix too
        spent = taken.cumsum(dim=1) - taken.cummax(dim=1).values
        fits = ordered_active & (spent <= rows.entropy_bound[:, None])
        masked = active.sum(dim=1)  # (b,)
        left = rows.steps_left.clamp_min(1)
        floor = torch.div(masked + left - 1, left, rounding_mode="floor")
        count = torch.minimum(torch.maximum(fits.sum(dim=1), floor), masked)  # (b,)
        rank = torch.arange(active.shape[1], device=active.device)[None, :]
        return torch.zeros_like(active).scatter_(1, order, rank < count[:, None])
