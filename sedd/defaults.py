"""Sampling defaults and names, in a module light enough for the CLI's parsers (no torch).

``DEFAULT_STEPS`` on the ``DEFAULT_GRID`` is the fewest model forwards whose quality is within
seed-to-seed noise of 50 uniform steps on the bundled model (the study: README, "Quality per
forward"). ``--steps N`` without a grid keeps st3's uniform grid, so st3 comparisons stay exact.
"""

from __future__ import annotations

from typing import Literal, get_args

TimeGrid = Literal["uniform", "cosine"]
TIME_GRIDS: tuple[str, ...] = get_args(TimeGrid)

DEFAULT_STEPS = 50
DEFAULT_GRID: TimeGrid = "uniform"
# the grid of a request that names its steps but no grid: st3's
STEPS_ONLY_GRID: TimeGrid = "uniform"


def resolve_schedule(steps: int | None, grid: str | None) -> tuple[int, str]:
    """(steps, grid) of a request that may leave either out: neither gives the tuned default;
    steps alone gives that many uniform steps (st3's schedule); a grid alone, the default
    number of steps on it."""
    if steps is None and grid is None:
        return DEFAULT_STEPS, DEFAULT_GRID
    if grid is None:
        return int(steps), STEPS_ONLY_GRID  # type: ignore[arg-type]
    return (DEFAULT_STEPS if steps is None else int(steps)), grid
