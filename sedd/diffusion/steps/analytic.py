"""The analytic (Tweedie tau-leaping) step on a time grid (reference SEDD's ``analytic``)."""

from __future__ import annotations

import torch

from sedd.diffusion.graph import Graph
from sedd.diffusion.steps.base import ReverseStep, StepTimes, tweedie_transition


class AnalyticStep(ReverseStep):
    """p(x_s = y) = [exp(-dsigma Q) s_theta](y) * exp(dsigma Q)(x, y), dsigma = sigma(t) -
    sigma(s): exact for a perfect score over any step. Under the absorbing graph a masked
    position jumps to y with weight (e^dsigma - 1) s_y."""

    name = "analytic"

    def unmask_coefficient(self, times: StepTimes) -> torch.Tensor:
        return torch.expm1(times.sigma_t - times.sigma_s)

    def transition(
        self, times: StepTimes, score: torch.Tensor, current: torch.Tensor, graph: Graph
    ) -> torch.Tensor:
        return tweedie_transition(times, score, current, graph)
