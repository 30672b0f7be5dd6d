"""A model's calibrated sampling schedule: ``calibration.json`` beside its weights.

``sedd calibrate`` searches, on held-out cells, for the fewest forwards a cell whose quality is
within seed noise of 50 uniform steps, and writes what it found here: the schedule (the
``sedd.defaults.Schedule`` a request that names none then runs), the sha256 of the weights it
was measured on, and every candidate's figures. A model that carries one uses it by default; a
file made for other weights is ignored with a warning (its figures describe another model).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sedd.checkpoints.io import CheckpointError, read_json
from sedd.defaults import DEFAULT_ENTROPY_BOUND, Predictor, Schedule, TimeGrid

CALIBRATION_FILE = "calibration.json"


class ScheduleFields(BaseModel):
    """The schedule as stored: the fields of ``sedd.defaults.Schedule``."""

    model_config = ConfigDict(extra="forbid")
    sampler: Predictor
    steps: int = Field(ge=1, le=2**32 - 1)
    time_grid: TimeGrid = "uniform"
    entropy_bound: float = Field(default=DEFAULT_ENTROPY_BOUND, ge=0, allow_inf_nan=False)


class Calibration(BaseModel):
    """``calibration.json``: the chosen schedule and how it was chosen."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = 1
    schedule: ScheduleFields
    weights_sha256: str  # the weights it was measured on
    reference: dict[str, Any]  # the schedule every candidate was held against (50 uniform)
    candidates: list[dict[str, Any]]  # each schedule tried, its forwards a cell and figures
    chosen: dict[str, Any] = Field(default_factory=dict)  # the choice, and whether it passed
    test: str = ""  # the rule a candidate passed
    cells_per_seed: int | None = None
    data: str = ""  # the held-out cells it was measured on
    command: str = ""  # how it was made

    def to_schedule(self) -> Schedule:
        return Schedule(**self.schedule.model_dump())


def calibration_path(source: Path) -> Path:
    """Where a model's calibration lives: in its directory (a file's: beside it)."""
    return (source if source.is_dir() else source.parent) / CALIBRATION_FILE


def read_calibration(source: Path, weights_sha256: str) -> Calibration | None:
    """The calibration beside ``source``, or None where there is none (or it was made for
    other weights: a warning says so). A malformed file raises ``CheckpointError``."""
    path = calibration_path(source)
    if not path.is_file():
        return None
    try:
        found = Calibration.model_validate(read_json(path))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise CheckpointError(
            f"{path}: `{where}` {first['msg'].lower()}; fix it, or delete it to sample with "
            "the library's default schedule."
        ) from None
    if found.weights_sha256 != weights_sha256:
        warnings.warn(
            f"{path} was calibrated on other weights (sha256 {found.weights_sha256[:12]}, these "
            f"are {weights_sha256[:12]}); ignored: run `sedd calibrate` on this model.",
            UserWarning,
            stacklevel=3,
        )
        return None
    return found
