"""The interface every reverse step implements (a diffusers scheduler's ``step``, per row).

A block of rows may mix step kinds (rows of different requests share a forward), so a kind does
not loop over rows: it computes its quantity for the whole block and ``Sampler`` keeps it on the
rows of that kind (``torch.where``), computing only the kinds present (``StepBranches.kinds``).

What a kind decides, given the rows' state, their time and the model's output:

* ``unmask_coefficient``: under the absorbing graph, the weight c of a jump out of the mask,
  p(x_s = y) = c s_theta(x)_y for every real token y (the rest of the mass stays masked);
* ``transition``: for any graph, the unnormalised p(x_s = y | x_t) at every position;
* ``choose``: which positions may change this step (``None``: every one that can); a kind that
  chooses also ``commits``: a chosen position always takes a real token, never stays masked;
* ``row_time``: where a row is in time when the kind reads it off the row's own state instead of
  a grid (the adaptive kinds), else ``None``;
* ``forwards``: the most forwards a cell takes, which admission prices a job by.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch

from sedd.diffusion.graph import Graph, one_hot
from sedd.diffusion.noise import Noise
from sedd.diffusion.step_rows import StepRows


@dataclass(frozen=True)
class StepTimes:
    """A block's rows with their noise levels, as every kind reads them (all (b,) tensors)."""

    rows: StepRows
    sigma_t: torch.Tensor  # fp64, sigma at the time each row steps from
    sigma_s: torch.Tensor  # fp64, at the time it steps to (0 for the final denoise)
    final: torch.Tensor  # bool: the row takes the final denoise (s == 0)
    noise: Noise


class ReverseStep(abc.ABC):
    """One kind of reverse step; stateless, so one instance serves every request."""

    name: ClassVar[str]  # the ``sampler`` option that picks it (``sedd.defaults.Predictor``)
    absorbing_only: ClassVar[bool] = False  # needs the absorbing (masked) graph
    commits: ClassVar[bool] = False  # a position it chooses always unmasks (no stay weight)
    adaptive: ClassVar[bool] = False  # reads each row's time off its tokens (no time grid)

    def forwards(self, steps: int, denoise: bool) -> int:
        """The most forwards a cell takes: one a step, and the final denoise."""
        return steps + (1 if denoise else 0)

    def row_time(self, x: torch.Tensor, graph: Graph, noise: Noise) -> torch.Tensor | None:
        """(b,) fp64 times read off the rows' tokens, for kinds that take no grid; else None."""
        return None

    @abc.abstractmethod
    def unmask_coefficient(self, times: StepTimes) -> torch.Tensor:
        """(b,) fp64 c: under the absorbing graph a masked position jumps to y with c s_y."""

    @abc.abstractmethod
    def transition(
        self, times: StepTimes, score: torch.Tensor, current: torch.Tensor, graph: Graph
    ) -> torch.Tensor:
        """Unnormalised p(x_s = y | x_t) at every position, (b, L, V) fp32, for any graph."""

    def choose(self, probs: torch.Tensor, stay: torch.Tensor, active: torch.Tensor,
               rows: StepRows) -> torch.Tensor | None:  # fmt: skip
        """(b, L) bool: the positions that may change this step, or None for every active
        one. ``probs`` (b, L, V) are the jump weights (the mask's column 0), ``stay`` (b, L)
        the weight of staying masked, ``active`` (b, L) the positions that can change."""
        return None


def euler_transition(times: StepTimes, score: torch.Tensor, current: torch.Tensor,
                     graph: Graph) -> torch.Tensor:  # fmt: skip
    """The Euler step (Lou et al. 2024, eq. 17): 1[y = x] + (t - s) sigma'(t) R_rev(x, y)."""
    rows = times.rows
    dt_rate = ((rows.t - rows.s) * times.noise.rate_noise(rows.t)).float()  # (b,)
    onehot = one_hot(current, graph.dim)
    return onehot + dt_rate[:, None, None] * graph.reverse_rate(current, score)


def tweedie_transition(times: StepTimes, score: torch.Tensor, current: torch.Tensor,
                       graph: Graph) -> torch.Tensor:  # fmt: skip
    """The analytic (Tweedie) update at dsigma = sigma(t) - sigma(s) (sigma(t) at the final
    denoise): [exp(-dsigma Q) s](y) * exp(dsigma Q)(x, y)."""
    dsigma = torch.where(times.final, times.sigma_t, times.sigma_t - times.sigma_s)
    dsigma = dsigma.float()[:, None]  # (b, 1)
    return graph.staggered_score(score, dsigma) * graph.transp_transition(current, dsigma)
