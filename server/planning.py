"""Requests -> engine jobs ("decode"): check the server's limits, resolve names, build tokens.

Each body becomes the library's one request type (``sedd.request.plan.GenerationRequest``) and
its one job builder (``job_for``): cell i of a request draws from the stream (seed, i), so a
request's cells equal those of the Python API and ``sedd generate`` for the same parameters.
Name errors become ``FieldError`` naming the field.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from sedd.checkpoints import LoadedModel, UnknownLabelError
from sedd.defaults import resolve_schedule
from sedd.engine import EngineJob
from sedd.io.tokens import CountClipWarning, CountRangeError
from sedd.request.conditions import perturbation_conditions
from sedd.request.plan import (
    GenerationRequest,
    Imputation,
    cell_plan,
    imputation_from_counts,
    job_for,
)
from server.config import Settings
from server.errors import FieldError
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest, SamplingOptions

RequestT = TypeVar("RequestT", bound=SamplingOptions)


@dataclass(frozen=True)
class PlannedJob:
    """An engine job plus what encoding its result needs."""

    job: EngineJob
    cells: pd.DataFrame  # one row per cell (cell_plan's columns), in cell order
    options: SamplingOptions
    timeout_s: float
    control: str | None = None
    observed_genes: tuple[str, ...] = ()
    dropped_genes: tuple[str, ...] = ()


def _with_default_steps(body: RequestT, settings: Settings) -> RequestT:
    """The request's schedule resolved (``sedd.defaults.resolve_schedule``); a request that
    leaves out ``steps`` gets the default capped at the server's max_steps."""
    steps, grid = resolve_schedule(body.steps, body.time_grid)
    if body.steps is None:
        steps = min(steps, settings.max_steps)
    return body.model_copy(update={"steps": steps, "time_grid": grid})


def _check_limits(settings: Settings, options: SamplingOptions, cells: int, loc: str) -> float:
    """The server's own limits; returns the request's timeout in seconds."""
    if options.steps > settings.max_steps:
        raise FieldError(
            ["body", "steps"],
            f"Input should be less than or equal to {settings.max_steps} (max_steps)",
            type="less_than_equal",
            input=options.steps,
            ctx={"le": settings.max_steps},
        )
    limit = settings.max_cells_per_request
    if cells > limit:
        raise FieldError(
            ["body", loc],
            f"the request asks for {cells} cells; the limit is {limit} (max_cells_per_request)",
            type="less_than_equal",
            input=cells,
            ctx={"le": limit},
        )
    timeout = settings.request_timeout_s
    return timeout if options.timeout_s is None else min(options.timeout_s, timeout)


def _plan(
    loaded: LoadedModel, request: GenerationRequest, names_loc: list[str | int]
) -> pd.DataFrame:
    try:
        return cell_plan(loaded, request)
    except UnknownLabelError as err:
        loc: list[str | int] = ["body", "cell_type"] if err.kind == "cell type" else names_loc
        listed = names_loc[-1] == "perturbations" and err.name in (request.conditions or ())
        if err.kind == "perturbation" and listed:
            loc = [*names_loc, (request.conditions or ()).index(err.name)]
        raise FieldError(
            loc,
            str(err),
            type=f"unknown_{err.kind.replace(' ', '_')}",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None


def _condition(loaded: LoadedModel, given: str | None) -> tuple[str, ...] | None:
    """The single condition of /generate and /impute: the control when none is given."""
    cfg = loaded.config
    if not loaded.conditional:
        if given is not None:
            raise FieldError(
                ["body", "condition"],
                "this model is unconditional: leave out `condition`",
                input=given,
            )
        return None
    name = given if given is not None else cfg.control_label
    if name is None:
        raise FieldError(
            ["body", "condition"],
            "this model is conditioned on perturbations and has no control label: pass `condition`",
        )
    return (name,)


def _generation_request(
    options: SamplingOptions,
    cells_per_condition: int,
    conditions: tuple[str, ...] | None,
    cell_type: str | None,
    imputation: Imputation | None = None,
) -> GenerationRequest:
    return GenerationRequest.of(
        cells_per_condition, conditions, cell_type, options.to_sampling(), imputation=imputation
    )


def _planned(
    loaded: LoadedModel,
    request: GenerationRequest,
    cells: pd.DataFrame,
    options: SamplingOptions,
    timeout: float,
    **extra: Any,
) -> PlannedJob:
    job = job_for(loaded, request, cells, deadline=time.monotonic() + timeout)
    return PlannedJob(job, cells, options, timeout, **extra)


def plan_generate(loaded: LoadedModel, settings: Settings, body: GenerateRequest) -> PlannedJob:
    body = _with_default_steps(body, settings)
    timeout = _check_limits(settings, body, body.num_cells, "num_cells")
    request = _generation_request(
        body, body.num_cells, _condition(loaded, body.condition), body.cell_type
    )
    cells = _plan(loaded, request, ["body", "condition"])
    return _planned(loaded, request, cells, body, timeout)


def plan_predict(loaded: LoadedModel, settings: Settings, body: PredictRequest) -> PlannedJob:
    body = _with_default_steps(body, settings)
    cfg = loaded.config
    if not loaded.conditional:
        raise FieldError(
            ["body", "perturbations"],
            "this model is unconditional: it has no perturbations to predict; use /generate",
            input=body.perturbations,
        )
    control = cfg.control_label
    if body.include_control and control is None:
        raise FieldError(
            ["body", "include_control"],
            "this model has no control label; set `include_control` to false",
            input=True,
        )
    conditions = _predicted_conditions(loaded, body)
    total = len(conditions) * body.cells_per_perturbation
    timeout = _check_limits(settings, body, total, "cells_per_perturbation")
    request = _generation_request(body, body.cells_per_perturbation, conditions, body.cell_type)
    cells = _plan(loaded, request, ["body", "perturbations"])
    has_control = control is not None and control in conditions
    return _planned(loaded, request, cells, body, timeout, control=control if has_control else None)


def _predicted_conditions(loaded: LoadedModel, body: PredictRequest) -> tuple[str, ...]:
    """The library's rule (``perturbation_conditions``: control first, duplicates dropped), so
    a /predict request numbers its cells as ``sedd predict`` and ``Model.predict`` do."""
    try:
        names = perturbation_conditions(
            loaded, body.perturbations, include_control=body.include_control
        )
    except UnknownLabelError as err:
        at = body.perturbations.index(err.name) if err.name in body.perturbations else None
        raise FieldError(
            ["body", "perturbations"] + ([] if at is None else [at]),
            str(err),
            type="unknown_perturbation",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None
    except ValueError as err:  # only the control was listed, and include_control removes it
        raise FieldError(["body", "include_control"], str(err), input=False) from None
    return tuple(names)


def plan_impute(loaded: LoadedModel, settings: Settings, body: ImputeRequest) -> PlannedJob:
    body = _with_default_steps(body, settings)
    num_cells = len(body.counts)
    timeout = _check_limits(settings, body, num_cells, "counts")
    imputation, dropped = _imputation(loaded, body)
    request = _generation_request(
        body, num_cells, _condition(loaded, body.condition), body.cell_type, imputation
    )
    cells = _plan(loaded, request, ["body", "condition"])
    return _planned(
        loaded, request, cells, body, timeout,
        observed_genes=imputation.genes, dropped_genes=dropped,
    )  # fmt: skip


def _imputation(loaded: LoadedModel, body: ImputeRequest) -> tuple[Imputation, tuple[str, ...]]:
    """The library's imputation of the body's counts, and the genes the model does not have
    (dropped and reported, as ``sedd impute`` does); errors named by field."""
    known = set(loaded.config.genes)
    keep = [i for i, gene in enumerate(body.genes) if gene in known]
    dropped = tuple(gene for gene in body.genes if gene not in known)
    if not keep:
        raise FieldError(
            ["body", "genes"],
            f"none of the {len(body.genes)} genes is one of the model's {len(known)} genes "
            f"(e.g. {list(loaded.config.genes[:3])}); use the model's gene identifiers "
            "(GET /v1/models lists them).",
            type="unknown_gene",
            input=body.genes[:5],
        )
    counts = np.asarray(body.counts, dtype=np.int64)[:, keep]
    try:
        genes = [body.genes[i] for i in keep]
        with warnings.catch_warnings():  # the client asked for clipping: no server log line
            warnings.simplefilter("ignore", CountClipWarning)
            return imputation_from_counts(loaded, genes, counts, clip=body.clip), dropped
    except CountRangeError as err:
        raise FieldError(
            ["body", "counts"],
            str(err),
            type="count_out_of_range",
            ctx={"max_count": loaded.config.tokens.max_count},
        ) from None
    except ValueError as err:  # a model without a mask
        raise FieldError(["body", "genes"], str(err), input=None) from None


def finite_or_zero(value: float) -> float:
    """Timings for the response: never NaN/Inf in a body."""
    return value if math.isfinite(value) else 0.0
