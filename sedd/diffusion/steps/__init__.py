"""The reverse steps, one module each behind one interface (``base.ReverseStep``).

``STEPS`` is every kind, in the order of their indices: a row's ``StepRows.kind`` is its kind's
position here. The names are ``sedd.defaults.PREDICTORS`` (the ``sampler`` option), in the same
order; ``tests/diffusion/test_steps.py`` checks that, and the engine-equals-reference tests run
every kind listed here, so a new step is a module, an entry here and a name there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sedd.defaults import OptionError, SamplingOptions
from sedd.diffusion.graph import Graph
from sedd.diffusion.step_rows import StepBranches, StepRows
from sedd.diffusion.steps.analytic import AnalyticStep
from sedd.diffusion.steps.base import ReverseStep, StepTimes
from sedd.diffusion.steps.entropy_bounded import EntropyBoundedStep
from sedd.diffusion.steps.euler import EulerStep

STEPS: tuple[ReverseStep, ...] = (EulerStep(), AnalyticStep(), EntropyBoundedStep())
STEP_NAMES: tuple[str, ...] = tuple(step.name for step in STEPS)

__all__ = [
    "STEPS",
    "STEP_NAMES",
    "ReverseStep",
    "StepTimes",
    "check_step_kind",
    "kind_index",
    "kinds_in",
    "per_kind",
    "step_kind",
]


def kind_index(name: str) -> int:
    """The index of the step kind ``name`` (a row's ``StepRows.kind``)."""
    try:
        return STEP_NAMES.index(name)
    except ValueError:
        known = ", ".join(STEP_NAMES)
        raise ValueError(f"`sampler` must be one of {known}, got {name!r}.") from None


def step_kind(name: str) -> ReverseStep:
    """The step kind called ``name``."""
    return STEPS[kind_index(name)]


def check_step_kind(options: SamplingOptions, graph: Graph) -> None:
    """Raise ``OptionError`` (naming ``sampler``) when the model's graph cannot take the kind of
    step ``options`` asks for: an adaptive step unmasks, so it needs the absorbing graph."""
    if step_kind(options.sampler).absorbing_only and not graph.absorb:
        raise OptionError(
            "sampler",
            f"`sampler` {options.sampler!r} needs a model on the absorbing (masked) graph; this "
            "model's graph is uniform: use euler or analytic.",
        )


def kinds_in(branches: StepBranches) -> list[tuple[int, ReverseStep]]:
    """(index, kind) of every step kind that a step's rows not at their final denoise take."""
    return [(i, step) for i, step in enumerate(STEPS) if step.name in branches.kinds]


def per_kind(
    rows: StepRows,
    kinds: list[tuple[int, ReverseStep]],
    value: Callable[[ReverseStep], torch.Tensor],
) -> torch.Tensor | None:
    """``value(kind)`` kept on the rows of each kind in ``kinds`` (``torch.where`` on the
    row's ``StepRows.kind``); None when there is no kind. One kind: its value as it is."""
    out: torch.Tensor | None = None
    for index, kind in kinds:
        mine = value(kind)
        if out is None:
            out = mine
        else:
            on = (rows.kind == index).view(-1, *([1] * (mine.dim() - 1)))
            out = torch.where(on, mine, out)
    return out
