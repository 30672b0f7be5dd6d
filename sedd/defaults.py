"""Sampling defaults and names, in a module light enough for the CLI's parsers (no torch).

A request that names no schedule runs its model's own (``Schedule``: the model's
``calibration.json``, written by ``sedd calibrate``; the bundled model carries one,
entropy-bounded unmasking at 10.6 forwards a cell, docs/quality.md "Quality per forward on v2").
A model without one runs ``LIBRARY_SCHEDULE``: ``DEFAULT_STEPS`` uniform Euler steps, chosen on
the first bundled model (``scripts/quality_vs_steps.py``; within noise of 50 steps there, not on
the model that learned stronger dependence between genes: calibrate a model before relying on
it). ``--steps N`` without a grid keeps st3's uniform grid, so st3 comparisons stay exact.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal, get_args

TimeGrid = Literal["uniform", "cosine"]
TIME_GRIDS: tuple[str, ...] = get_args(TimeGrid)
# the reverse step (``sedd.diffusion.steps``, one module each, in this order): Euler or analytic
# (Tweedie tau-leaping) on a time grid, or entropy-bounded adaptive unmasking
Predictor = Literal["euler", "analytic", "entropy"]
PREDICTORS: tuple[str, ...] = get_args(Predictor)
MAX_SEED = 2**63 - 1  # seeds are int64 Philox keys (``sedd.diffusion.randomness``)
MAX_STEPS = 2**32 - 1  # a step number is one 32-bit Philox counter word

DEFAULT_STEPS = 10
# the entropy-bounded step's bound (nats) when a request names none
DEFAULT_ENTROPY_BOUND = 1.0
# cells a batch (an engine job) of an offline run: memory, never a cell (``EngineSettings``)
DEFAULT_BATCH_SIZE = 64
DEFAULT_GRID: TimeGrid = "uniform"
# the grid of a request that names its steps but no grid: st3's
STEPS_ONLY_GRID: TimeGrid = "uniform"


def default_device() -> str:
    """The device every front door uses when none is given: "cuda" when torch sees a GPU, else
    "cpu" (torch is imported here, on first use, so the CLI's parsers stay light)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


THREADS_ENV = "SEDD_THREADS"


def resolve_threads(threads: int | None) -> int | None:
    """The torch threads a run samples on: ``threads``, else ``SEDD_THREADS``, else None (leave
    torch's setting). Set where sampling starts, so a library that changed torch's threads in
    the same process (scanpy's ``pp.normalize_total`` can) cannot slow sampling."""
    import os

    if threads is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if not text:
            return None
        if not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"{THREADS_ENV}={text!r}: must be a whole number >= 1 (torch threads)."
            )
        return int(text)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"`threads` must be a whole number >= 1 (or None), got {threads!r}.")
    return threads


@dataclass(frozen=True)
class Schedule:
    """How a model samples when a request names no schedule: the library's tuned default, or a
    model's own calibration (``calibration.json`` beside its weights, written by
    ``sedd calibrate``; ``sedd.checkpoints.calibration``)."""

    sampler: Predictor = "euler"
    steps: int = DEFAULT_STEPS  # for an adaptive sampler: the most forwards a cell takes
    time_grid: TimeGrid = DEFAULT_GRID
    entropy_bound: float = DEFAULT_ENTROPY_BOUND

    def record(self) -> dict[str, Any]:
        """As JSON: the fields a ``SamplingOptions`` record keys them by."""
        out: dict[str, Any] = {"sampler": self.sampler, "steps": self.steps}
        if self.time_grid != "uniform":
            out["time_grid"] = self.time_grid
        if self.sampler == "entropy":
            out["entropy_bound"] = self.entropy_bound
        return out


LIBRARY_SCHEDULE = Schedule()
# the options a schedule resolves together (``resolve_schedule``): left out, they come from it
SCHEDULE_FIELDS: tuple[str, ...] = ("steps", "time_grid", "sampler", "entropy_bound")


def resolve_schedule(
    steps: int | None,
    grid: str | None,
    sampler: str | None = None,
    entropy_bound: float | None = None,
    default: Schedule = LIBRARY_SCHEDULE,
) -> dict[str, Any]:
    """The schedule fields (steps, time_grid, sampler, entropy_bound) of a request that may
    leave any out:

    * none of steps, grid and sampler: ``default`` (the model's calibrated schedule, or the
      library's tuned one), with ``entropy_bound`` if given;
    * steps alone: that many uniform Euler steps (st3's schedule); a grid alone, the default
      number of steps on it;
    * a sampler: its own schedule where ``default`` is of that sampler, else the library's
      defaults for the fields left out.
    """
    if steps is None and grid is None and sampler is None:
        bound = default.entropy_bound if entropy_bound is None else entropy_bound
        return {"steps": default.steps, "time_grid": default.time_grid,
                "sampler": default.sampler, "entropy_bound": bound}  # fmt: skip
    own = default if sampler is not None and sampler == default.sampler else LIBRARY_SCHEDULE
    if steps is None and grid is None:
        steps, grid = own.steps, own.time_grid
    elif grid is None:
        grid = STEPS_ONLY_GRID
    elif steps is None:
        steps = DEFAULT_STEPS
    return {
        "steps": int(steps),  # type: ignore[arg-type]
        "time_grid": grid,
        "sampler": "euler" if sampler is None else sampler,
        "entropy_bound": own.entropy_bound if entropy_bound is None else entropy_bound,
    }


# What ships inside the package (package data, in the wheel too; the checkout's models/
# pbmc_default and data/ point here), found with importlib.resources, never through a checkout.
BUNDLED = Path(str(files("sedd").joinpath("bundled")))
# The model served and sampled when no path is given: the bundled PBMC model.
DEFAULT_MODEL = BUNDLED / "pbmc_default"
# The bundled real counts (PBMC 68k reduced, 700 cells x 765 genes) the default model trained on.
BUNDLED_DATA = BUNDLED / "data" / "pbmc68k_counts.h5ad"

# Cells per perturbation when none is asked for: st3's own default (`--num_samples_per_pert`),
# shared by every entry point (the st3 scripts, `sedd predict`, `Model.predict`, HTTP /predict).
CELLS_PER_PERTURBATION = 10


class OptionError(ValueError):
    """A sampling option out of its range; ``field`` names it (the HTTP body's field too)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _about(
    help: str, *flags: str, recorded_when: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """A ``SamplingOptions`` field's metadata: its help text, extra CLI spellings, and when the
    record holds it (``None``: always; a predicate of the options, for a field recorded only
    where it differs from how earlier records were made, so their run ids hold)."""
    return {"help": help, "flags": flags, "recorded_when": recorded_when}


@dataclass(frozen=True)
class SamplingOptions:
    """How cells are sampled (vLLM's ``SamplingParams``): one value, carried whole from every
    front door through the request (``GenerationRequest.sampling``) to each engine job
    (``EngineJob.sampling``), and checked once, here, when it is made.

    A new option is a field here (the CLI flag and the Python keyword follow from it) and a
    field of the HTTP body (``server/schemas.py``, with the server's bounds). An invalid value
    raises ``OptionError`` naming the field; the server reports it at ``["body", field]``.
    """

    steps: int = field(default=DEFAULT_STEPS, metadata=_about(
        "reverse steps; for --sampler entropy, the most forwards a cell takes (default: the "
        "model's schedule, its calibration.json, else 10 uniform steps; --steps alone gives "
        "st3's uniform Euler steps)",
        "--num-steps",
    ))  # fmt: skip
    time_grid: TimeGrid = field(default=DEFAULT_GRID, metadata=_about(
        "how t falls from 1 to 0: uniform (st3's) or cosine (few genes first)", "--grid",
        recorded_when=lambda options: options.time_grid != "uniform",
    ))  # fmt: skip
    sampler: Predictor = field(default="euler", metadata=_about(
        "the reverse step: euler or analytic (Tweedie) on the time grid, or entropy "
        "(entropy-bounded adaptive unmasking: --steps is then the most forwards a cell takes)"
    ))  # fmt: skip
    temperature: float = field(
        default=1.0, metadata=_about("1 samples the model's law; below 1 sharpens it")
    )
    seed: int = field(default=0, metadata=_about("cell i draws from stream (seed, i)"))
    entropy_bound: float = field(default=DEFAULT_ENTROPY_BOUND, metadata=_about(
        "sampler entropy: each forward commits a cell's surest masked genes while their "
        "entropies sum to at most this (nats); 0 commits one gene a forward",
        recorded_when=lambda options: options.sampler == "entropy",  # the only step it moves
    ))  # fmt: skip

    def __post_init__(self) -> None:
        for name, kind, cast in (("steps", _is_int, int), ("seed", _is_int, int),
                                 ("temperature", _is_real, float),
                                 ("entropy_bound", _is_real, float)):  # fmt: skip
            if kind(getattr(self, name)):  # numpy scalars too; 1 and 1.0 record alike
                object.__setattr__(self, name, cast(getattr(self, name)))
        steps, temperature, seed = self.steps, self.temperature, self.seed
        bound = self.entropy_bound
        checks = (
            ("steps", _is_int(steps) and steps >= 1, ">= 1"),
            ("steps", _is_int(steps) and steps <= MAX_STEPS, f"<= {MAX_STEPS}"),
            ("time_grid", self.time_grid in TIME_GRIDS, f"one of {', '.join(TIME_GRIDS)}"),
            ("sampler", self.sampler in PREDICTORS, f"one of {', '.join(PREDICTORS)}"),
            ("temperature", _is_real(temperature) and math.isfinite(temperature)
             and temperature > 0, "finite and > 0"),
            ("seed", _is_int(seed) and 0 <= seed <= MAX_SEED, "in [0, 2**63 - 1]"),
            ("entropy_bound", _is_real(bound) and math.isfinite(bound) and bound >= 0,
             "finite and >= 0"),
        )  # fmt: skip
        for name, ok, rule in checks:
            if not ok:
                raise OptionError(name, f"`{name}` must be {rule}, got {getattr(self, name)!r}.")

    @classmethod
    def resolve(
        cls,
        steps: int | None = None,
        time_grid: str | None = None,
        sampler: str | None = None,
        entropy_bound: float | None = None,
        *,
        default: Schedule = LIBRARY_SCHEDULE,
        **options: Any,
    ) -> SamplingOptions:
        """Options with the schedule resolved (``resolve_schedule``): no ``steps``,
        ``time_grid`` or ``sampler`` gives ``default`` (the model's calibrated schedule, or the
        library's tuned one); ``steps`` alone, st3's uniform grid. ``options``: the other
        fields by name; an unknown name raises ``OptionError``."""
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            known = ", ".join(OPTION_NAMES)
            raise OptionError(unknown[0], f"`{unknown[0]}` is not a sampling option ({known}).")
        schedule = resolve_schedule(steps, time_grid, sampler, entropy_bound, default)
        return cls(**schedule, **options)

    @classmethod
    def of(
        cls, sampling: SamplingOptions | None, options: dict[str, Any], default: Schedule
    ) -> SamplingOptions:
        """A Python method's sampling options: its ``sampling`` value, or one made from its
        keywords (``resolve`` with the model's ``default`` schedule)."""
        if sampling is None:
            return cls.resolve(**options, default=default)
        if options:
            raise ValueError(
                f"pass `sampling` or sampling options by keyword ({', '.join(sorted(options))}), "
                "not both."
            )
        if not isinstance(sampling, SamplingOptions):
            raise TypeError(f"`sampling` must be a sedd.SamplingOptions, got {sampling!r}.")
        return sampling

    def record(self) -> dict[str, Any]:
        """The options as plain JSON values (run ids, shard identities, provenance), derived from
        the fields themselves: a new option is recorded without a list to update. A field whose
        metadata says ``recorded_when`` is left out where that is false (``time_grid`` on the
        uniform grid, ``entropy_bound`` off the entropy sampler), so earlier run ids hold."""
        out: dict[str, Any] = {}
        for option in fields(self):
            when = option.metadata.get("recorded_when")
            if when is None or when(self):
                out[option.name] = getattr(self, option.name)
        return out


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SamplingOptions))


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
