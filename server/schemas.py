"""Request bodies, with bounds, OpenAPI examples and validators: declarations only (the
responses: ``server.responses``).

Static bounds here are the hard ceilings (``server.config``); the server's own limits
(``max_cells_per_request``, ``max_steps``) are checked when a body becomes the library's request
(``server.intake``) and written into the OpenAPI schema by ``server.openapi.apply_limits``, so
clients and schemathesis see the real maxima.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from sedd.defaults import CELLS_PER_PERTURBATION, Predictor, TimeGrid
from sedd.request.draws import MAX_N_SAMPLES
from server.config import HARD_MAX_CELLS, HARD_MAX_GENES, HARD_MAX_STEPS

SamplerName = Predictor  # the library's one definition
OutputFormat = Literal["json", "h5ad"]
Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _Request(BaseModel):
    """Strict: unknown fields are refused, and nothing is coerced (``"2"`` and ``true`` are not
    the integer 2 or 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingOptions(_Request):
    """Fields every sampling route shares."""

    steps: int | None = Field(
        default=None,
        ge=1,
        le=HARD_MAX_STEPS,
        description="reverse steps (sampler entropy: the most forwards a cell takes); left "
        "out with time_grid and sampler: the model's default schedule (GET /v1/models: "
        "default_schedule; capped at max_steps); given alone: that many uniform Euler steps "
        "(st3's schedule)",
    )
    time_grid: TimeGrid | None = Field(
        default=None, description="how t falls from 1 to 0: uniform (st3's) or cosine"
    )
    sampler: SamplerName | None = Field(
        default=None,
        description="reverse step: euler or analytic on the time grid, or entropy (entropy-"
        "bounded adaptive unmasking; a cell ends when its genes are drawn); left out: the "
        "model's default schedule's, or euler when steps or time_grid is given",
    )
    entropy_bound: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="sampler entropy: a forward commits a cell's surest masked genes while their "
        "entropies sum to at most this (nats); left out: the model's default schedule's",
    )
    temperature: float = Field(
        default=1.0, ge=0.05, le=10.0, allow_inf_nan=False, description="1 = the model's law"
    )
    seed: int = Field(
        default=0, ge=0, le=2**63 - 1, description="cell i draws from the stream (seed, i)"
    )
    format: OutputFormat = Field(
        default="json",
        description="json, or h5ad bytes (also chosen by `Accept: application/x-hdf5`)",
    )
    timeout_s: float | None = Field(
        default=None,
        ge=1,
        le=86_400,
        allow_inf_nan=False,
        description="deadline for this request; at most the server's request_timeout_s",
    )
    model: Name | None = Field(
        default=None,
        description="which served model answers: its id (GET /v1/models), as OpenAI-style "
        "clients send it; left out, the default model. An id the server does not serve is a 404 "
        "naming the served ones. The condition, perturbation and cell-type names and the genes "
        "a body may use are that model's (its card lists them)",
    )


class GenerateRequest(SamplingOptions):
    """Whole cells of one condition (conditional models; the model's default condition when
    left out), or a label mix: ``conditions`` maps each condition to its number of cells.

    Unlike ``Model.generate`` and ``sedd generate``, which make cells of every condition when
    none is named, a body without ``condition`` or ``conditions`` gets cells of the default
    condition only (``default_condition`` in GET /v1/models)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"num_cells": 2, "steps": 10, "condition": "CD19+ B", "seed": 1},
                {"conditions": {"CD19+ B": 3, "CD56+ NK": 1}, "steps": 10, "seed": 1},
            ]
        }
    )

    num_cells: int = Field(default=1, ge=1, le=HARD_MAX_CELLS, description="cells to generate")
    condition: Name | None = Field(
        default=None,
        description="the cells' condition (perturbation or cell type); default: the model's "
        "default condition (its control label)",
    )
    conditions: dict[Name, Annotated[int, Field(ge=1, le=HARD_MAX_CELLS)]] | None = Field(
        default=None,
        max_length=1000,
        description="a label mix: cells of each condition, instead of `num_cells` and "
        "`condition`; the same cells as `Model.generate(like=...)` with these per-label counts",
    )
    cell_type: Name | None = Field(default=None, description="cell type (models that have them)")

    @model_validator(mode="after")
    def _one_kind(self) -> GenerateRequest:
        if self.conditions is not None and {"num_cells", "condition"} & self.model_fields_set:
            raise ValueError(
                "pass `conditions` (cells of each condition) or `num_cells`/`condition`, not both"
            )
        if self.conditions is not None and not self.conditions:
            raise ValueError("`conditions` must name at least one condition")
        return self


class PredictRequest(SamplingOptions):
    """Cells for each perturbation, their per-gene means and the shift versus control."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "perturbations": ["CD19+ B", "CD56+ NK"],
                    "cells_per_perturbation": 2,
                    "include_control": True,
                    "steps": 10,
                }
            ]
        }
    )

    perturbations: list[Name] = Field(min_length=1, max_length=1000)
    cells_per_perturbation: int = Field(
        default=CELLS_PER_PERTURBATION,
        ge=1,
        le=HARD_MAX_CELLS,
        description=f"cells per perturbation, control included (default {CELLS_PER_PERTURBATION}"
        ", st3's, as `sedd predict` and `Model.predict`)",
    )
    cell_type: Name | None = None
    include_control: bool = Field(
        default=True, description="also generate control cells (with the control label)"
    )

    @model_validator(mode="after")
    def _unique(self) -> PredictRequest:
        if len(set(self.perturbations)) != len(self.perturbations):
            raise ValueError("`perturbations` must not repeat a name")
        return self


class ImputeRequest(SamplingOptions):
    """Counts for some genes of some cells; the other genes are sampled given them."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"genes": ["CD3D", "LYZ"], "counts": [[2, 0], [0, 7]], "steps": 10}]
        }
    )

    genes: list[Name] = Field(min_length=1, max_length=HARD_MAX_GENES)
    counts: list[list[Count]] = Field(
        min_length=1, max_length=HARD_MAX_CELLS, description="one row per cell, one per gene"
    )
    condition: Name | None = Field(
        default=None, description="condition of every cell; default: the model's control label"
    )
    cell_conditions: list[Name] | None = Field(
        default=None,
        max_length=HARD_MAX_CELLS,
        description="a condition per cell (one per row of `counts`), instead of `condition`",
    )
    cell_type: Name | None = None
    cell_types: list[Name] | None = Field(
        default=None,
        max_length=HARD_MAX_CELLS,
        description="a cell type per cell (one per row of `counts`; models with cell types), "
        "instead of `cell_type`",
    )
    clip: bool = Field(
        default=False,
        description="clip counts above the model's largest count instead of refusing them",
    )
    n_samples: int = Field(
        default=1,
        ge=1,
        le=MAX_N_SAMPLES,
        description="sample each cell this many times and add the per-cell mean of the draws as "
        "`mean_of_draws` (`counts` stays the first draw; draw j of cell i uses stream "
        "(seed, j * N + i)); counts as n_samples x the cells against the server's limits",
    )
    expected: bool = Field(
        default=False,
        description="also answer `expected_counts`: per draw, each sampled gene's mean count "
        "under the distribution it was drawn from (at the request's temperature), averaged over "
        "the n_samples draws: the expected counts with less noise than `mean_of_draws` (a "
        "Rao-Blackwellised mean); observed genes hold their count; `counts` do not change",
    )

    @model_validator(mode="after")
    def _shape(self) -> ImputeRequest:
        if len(set(self.genes)) != len(self.genes):
            raise ValueError("`genes` must not repeat a name")
        for i, row in enumerate(self.counts):
            if len(row) != len(self.genes):
                raise ValueError(
                    f"`counts` row {i} has {len(row)} values but `genes` names {len(self.genes)}"
                )
        for many, one, what in (
            ("cell_conditions", "condition", "conditions"),
            ("cell_types", "cell_type", "cell types"),
        ):
            per_cell = getattr(self, many)
            if per_cell is not None and len(per_cell) != len(self.counts):
                raise ValueError(
                    f"`{many}` names {len(per_cell)} {what} but `counts` has "
                    f"{len(self.counts)} cells: give one per cell"
                )
            if per_cell is not None and getattr(self, one) is not None:
                raise ValueError(f"pass `{one}` or `{many}`, not both")
        return self
