"""The reverse-time grid: the one place a sampling schedule becomes times."""

from __future__ import annotations

import torch

from sedd.defaults import TIME_GRIDS, TimeGrid


def time_grid(steps: int, eps: float = 1e-5, grid: TimeGrid | str = "uniform") -> torch.Tensor:
    """The reverse-time grid, (steps + 1,) fp64, from t_0 = 1 down to t_steps = eps.

    The only place a grid is built. A row walks t_0 > t_1 > ... > t_steps, then the final
    denoise takes it from eps to 0. Under the absorbing graph with log-linear noise a step from
    t to s unmasks a fraction (t - s) / t of the masked genes, so the grid decides how many genes
    are drawn together at each step:

    * ``"uniform"``: t_k = 1 - (1 - eps) k / steps, equal numbers of genes per step (st3's and
      reference SEDD's grid);
    * ``"cosine"``: t_k = eps + (1 - eps) cos(pi k / (2 steps)), few genes while the context is
      thin and more as it fills (MaskGIT's schedule).
    """
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}.")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"`eps` must be in (0, 1), got {eps}.")
    if grid not in TIME_GRIDS:
        raise ValueError(f"`time_grid` must be one of {', '.join(TIME_GRIDS)}, got {grid!r}.")
    if grid == "uniform":
        return torch.linspace(1.0, eps, steps + 1, dtype=torch.float64)
    k = torch.arange(steps + 1, dtype=torch.float64)
    return eps + (1.0 - eps) * torch.cos(0.5 * torch.pi * k / steps)
