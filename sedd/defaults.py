"""Sampling defaults and names, in a module light enough for the CLI's parsers (no torch).

``DEFAULT_STEPS`` on the ``DEFAULT_GRID`` is the fewest model forwards whose quality is within
seed-to-seed noise of 50 uniform steps on the bundled model (``scripts/quality_vs_steps.py``;
docs/quality.md, "Quality per forward"): 10 uniform steps, about 10.6 forwards a cell against
50.8. 5 steps lose within-label structure, and the cosine grid was no better than the uniform one.
``--steps N`` without a grid keeps st3's uniform grid, so st3 comparisons stay exact. A model
that learned stronger dependence between genes may need more steps: measure it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

TimeGrid = Literal["uniform", "cosine"]
TIME_GRIDS: tuple[str, ...] = get_args(TimeGrid)

DEFAULT_STEPS = 10
DEFAULT_GRID: TimeGrid = "uniform"
# the grid of a request that names its steps but no grid: st3's
STEPS_ONLY_GRID: TimeGrid = "uniform"


def default_device() -> str:
    """ "cuda" when torch sees a GPU, else "cpu": the device every front door uses when none is
    given (torch is imported here, on first use, so the CLI's parsers stay light)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_schedule(steps: int | None, grid: str | None) -> tuple[int, str]:
    """(steps, grid) of a request that may leave either out: neither gives the tuned default;
    steps alone gives that many uniform steps (st3's schedule); a grid alone, the default
    number of steps on it."""
    if steps is None and grid is None:
        return DEFAULT_STEPS, DEFAULT_GRID
    if grid is None:
        return int(steps), STEPS_ONLY_GRID  # type: ignore[arg-type]
    return (DEFAULT_STEPS if steps is None else int(steps)), grid


# Paths of what ships with the package (the CLI's parsers read these too).
# The repository root when installed from a checkout (`pip install -e .`): models/ and data/.
ROOT = Path(__file__).resolve().parents[1]
# The model served and sampled when no path is given: the bundled PBMC model.
DEFAULT_MODEL = ROOT / "models" / "pbmc_default"
# The bundled real counts (PBMC 68k reduced, 700 cells x 765 genes) the default model trained on.
BUNDLED_DATA = ROOT / "data" / "pbmc68k_counts.h5ad"

# Cells per perturbation when none is asked for: st3's own default (`--num_samples_per_pert`),
# shared by every entry point (the st3 scripts, `sedd predict`, `Model.predict`, HTTP /predict).
CELLS_PER_PERTURBATION = 10
