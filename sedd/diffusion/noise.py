"""Noise schedules: total noise sigma(t) and its rate sigma'(t), for t in [0, 1].

Time runs from data (t = 0) to the limiting distribution (t = 1). Under an absorbing graph a
position is masked at time t with probability 1 - exp(-sigma(t)).

Schedules compute in the dtype of ``t``; samplers pass fp64 times so that the step arithmetic is
exact to well below fp32 resolution, then cast what the model sees to fp32.
"""

from __future__ import annotations

import abc
import math

import torch


class Noise(abc.ABC):
    """A noise schedule sigma(t) with rate sigma'(t) = d sigma / dt."""

    @abc.abstractmethod
    def total_noise(self, t: torch.Tensor) -> torch.Tensor:
        """sigma(t) = integral_0^t sigma'(u) du (plus sigma(0))."""

    @abc.abstractmethod
    def rate_noise(self, t: torch.Tensor) -> torch.Tensor:
        """sigma'(t)."""

    def __call__(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.total_noise(t), self.rate_noise(t)

    def time_of_mask_fraction(self, fraction: torch.Tensor) -> torch.Tensor:
        """The t in [0, 1] at which the absorbing graph masks ``fraction`` of the positions,
        1 - exp(-sigma(t)) = fraction (1 past the schedule's end): the time an adaptive step
        reads off a row's state. Bisection in fp64 over the monotone sigma, 60 halvings (to
        2^-60); schedules with a closed form override it."""
        target = -torch.log1p(-fraction.double().clamp(0.0, 1.0))  # sigma wanted, (b,)
        lo, hi = torch.zeros_like(target), torch.ones_like(target)
        for _ in range(60):
            mid = (lo + hi) / 2
            below = self.total_noise(mid) < target
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return hi

    @abc.abstractmethod
    def config(self) -> dict[str, object]:
        """A JSON-serialisable description, e.g. ``{"type": "loglinear", "eps": 1e-3}``."""


class LogLinearNoise(Noise):
    """sigma(t) = -log(1 - (1 - eps) t), so the mask probability 1 - e^{-sigma} = (1 - eps) t.

    sigma'(t) = (1 - eps) / (1 - (1 - eps) t). The schedule of masked diffusion (st3 and the
    reference SEDD absorbing models).
    """

    def __init__(self, eps: float = 1e-3) -> None:
        if not 0.0 < eps < 1.0:
            raise ValueError(f"LogLinearNoise eps must be in (0, 1), got {eps}.")
        self.eps = eps

    def total_noise(self, t: torch.Tensor) -> torch.Tensor:
        return -torch.log1p(-(1 - self.eps) * t)

    def rate_noise(self, t: torch.Tensor) -> torch.Tensor:
        return (1 - self.eps) / (1 - (1 - self.eps) * t)

    def time_of_mask_fraction(self, fraction: torch.Tensor) -> torch.Tensor:
        """t = fraction / (1 - eps), at most 1."""
        return (fraction.double() / (1 - self.eps)).clamp(0.0, 1.0)

    def config(self) -> dict[str, object]:
        return {"type": "loglinear", "eps": self.eps}


class GeometricNoise(Noise):
    """sigma(t) = sigma_min^(1 - t) * sigma_max^t; sigma'(t) = sigma(t) log(sigma_max / sigma_min).

    The reference SEDD schedule for uniform-graph models.
    """

    def __init__(self, sigma_min: float = 1e-3, sigma_max: float = 1.0) -> None:
        if not 0.0 < sigma_min < sigma_max:
            raise ValueError(
                f"GeometricNoise needs 0 < sigma_min < sigma_max, got {sigma_min}, {sigma_max}."
            )
        self.sigma_min = sigma_min
        self.sigma_max = sigma_max

    def total_noise(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_min ** (1 - t) * self.sigma_max**t

    def rate_noise(self, t: torch.Tensor) -> torch.Tensor:
        return self.total_noise(t) * math.log(self.sigma_max / self.sigma_min)

    def config(self) -> dict[str, object]:
        return {"type": "geometric", "sigma_min": self.sigma_min, "sigma_max": self.sigma_max}


def noise_from_config(cfg: dict[str, object]) -> Noise:
    """Build a schedule from ``Noise.config()`` output or a reference SEDD ``noise`` section."""
    match cfg.get("type"):
        case "loglinear":
            return LogLinearNoise(float(cfg.get("eps", 1e-3)))  # type: ignore[arg-type]
        case "geometric":
            return GeometricNoise(float(cfg["sigma_min"]), float(cfg["sigma_max"]))  # type: ignore[arg-type]
        case other:
            raise ValueError(f"noise type must be 'loglinear' or 'geometric', got {other!r}.")
