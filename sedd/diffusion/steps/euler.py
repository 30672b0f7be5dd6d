"""The Euler step on a time grid (SEDD's default predictor and st3's)."""

from __future__ import annotations

import torch

from sedd.diffusion.graph import Graph
from sedd.diffusion.steps.base import ReverseStep, StepTimes, euler_transition


class EulerStep(ReverseStep):
    """p(x_s = y) = 1[y = x] + (t - s) sigma'(t) R_rev(x, y), with R_rev(x, y) = Q(y, x) s_y.

    Under the absorbing graph with log-linear noise a step from t to s unmasks (t - s) / t of the
    masked genes, each independently. Rows at s = 0 take the final denoise (``Sampler``)."""

    name = "euler"

    def unmask_coefficient(self, times: StepTimes) -> torch.Tensor:
        rows = times.rows
        return (rows.t - rows.s) * times.noise.rate_noise(rows.t)

    def transition(
        self, times: StepTimes, score: torch.Tensor, current: torch.Tensor, graph: Graph
    ) -> torch.Tensor:
        return euler_transition(times, score, current, graph)
