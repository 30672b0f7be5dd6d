"""Intake: a sampling body -> the library's request -> its plan -> admission by cost, top to
bottom; everything a sampling route does before ``server.runner`` runs the job.

1. ``to_request``: the body (``server.schemas``, declarations only) becomes the library's one
   request type, ``GenerationRequest``, within the server's limits (``max_steps``,
   ``max_cells_per_request``) and with the model's names checked (``server.names``);
2. ``plan_body``: that request planned once with the library's one planning call
   (``sedd.request.plan.plan``): cell i draws from the stream (seed, i), so a request's cells
   equal those of the Python API and ``sedd generate`` for the same parameters;
3. ``check_cost``: the planned job priced against its deadline and the work already admitted
   (``server.runner.submit`` calls it before it queues the job).

Steps 1 and 2 refuse with a ``FieldError`` naming the field (422); step 3 with a 422
``too_costly`` or a 429 ``Overloaded`` carrying Retry-After.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from sedd.checkpoints import LoadedModel, UnknownLabelError
from sedd.defaults import LIBRARY_SCHEDULE, OPTION_NAMES, OptionError, Schedule, resolve_schedule
from sedd.defaults import SamplingOptions as Sampling
from sedd.engine import EngineJob
from sedd.engine.admission import Work
from sedd.request.plan import GenerationRequest, Plan, plan
from server import names
from server.config import Settings
from server.errors import DeadlineExceeded, FieldError, Overloaded
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest, SamplingOptions
from server.state import Service

# 1. body -> request ---------------------------------------------------------------------------


def to_request(body: SamplingOptions, loaded: LoadedModel, settings: Settings) -> GenerationRequest:
    """The library's one request type for ``body``, within the server's limits: its sampling
    options first (``to_sampling``), then the cells it asks for and the model's names."""
    sampling = to_sampling(body, settings, loaded.schedule)
    match body:
        case GenerateRequest():
            return _generate(body, loaded, settings, sampling)
        case PredictRequest():
            return _predict(body, loaded, settings, sampling)
        case ImputeRequest():
            return _impute(body, loaded, settings, sampling)
    raise TypeError(f"no request for a {type(body).__name__} body")


def to_sampling(
    body: SamplingOptions, settings: Settings, schedule: Schedule = LIBRARY_SCHEDULE
) -> Sampling:
    """The library's sampling options for ``body``, every field named as the body names it
    (``SamplingOptions``' fields), its schedule resolved (``sedd.defaults.resolve_schedule``,
    from the model's ``schedule`` where the body names none) and a left-out ``steps`` capped at
    ``max_steps``. The value checks itself: ``OptionError``
    names the field (``plan_body`` reports it)."""
    options = {name: getattr(body, name) for name in OPTION_NAMES}
    options.update(resolve_schedule(body.steps, body.time_grid, body.sampler,
                                    body.entropy_bound, schedule))  # fmt: skip
    if body.steps is None:
        options["steps"] = min(options["steps"], settings.max_steps)
    _check_steps(settings, options["steps"])
    return Sampling(**options)


def _generate(
    body: GenerateRequest, loaded: LoadedModel, settings: Settings, sampling: Sampling
) -> GenerationRequest:
    if body.conditions is not None:
        labels, counts = names.mix(loaded, body.conditions)
        _check_cells(settings, sum(counts), "conditions")
        return GenerationRequest(1, labels, body.cell_type, sampling, condition_counts=counts)
    _check_cells(settings, body.num_cells, "num_cells")
    condition = names.one_condition(loaded, body.condition)
    return GenerationRequest(body.num_cells, condition, body.cell_type, sampling)


def _predict(
    body: PredictRequest, loaded: LoadedModel, settings: Settings, sampling: Sampling
) -> GenerationRequest:
    conditions = names.predicted_conditions(loaded, body.perturbations, body.include_control)
    n = body.cells_per_perturbation
    _check_cells(settings, len(conditions) * n, "cells_per_perturbation")
    return GenerationRequest(n, conditions, body.cell_type, sampling)


def _impute(
    body: ImputeRequest, loaded: LoadedModel, settings: Settings, sampling: Sampling
) -> GenerationRequest:
    _check_cells(settings, len(body.counts), "counts")
    _check_draws(settings, len(body.counts), body.n_samples)
    imputation = names.imputation(loaded, body.genes, body.counts, body.clip)
    if body.cell_types is not None:
        imputation = names.cell_types(loaded, imputation, body.cell_types)
    if body.cell_conditions is not None:
        labels, counts = names.cell_conditions(loaded, body.cell_conditions)
        return GenerationRequest(
            1,
            labels,
            body.cell_type,
            sampling,
            imputation=imputation,
            condition_counts=counts,
            n_samples=body.n_samples,
            expected=body.expected,
        )
    condition = names.one_condition(loaded, body.condition)
    return GenerationRequest(
        imputation.num_cells,
        condition,
        body.cell_type,
        sampling,
        imputation=imputation,
        n_samples=body.n_samples,
        expected=body.expected,
    )


def _check_steps(settings: Settings, steps: int) -> None:
    if steps > settings.max_steps:
        raise FieldError(
            ["body", "steps"],
            f"Input should be less than or equal to {settings.max_steps} (max_steps)",
            type="less_than_equal",
            input=steps,
            ctx={"le": settings.max_steps},
        )


def _check_cells(settings: Settings, cells: int, loc: str) -> None:
    limit = settings.max_cells_per_request
    if cells > limit:
        raise FieldError(
            ["body", loc],
            f"the request asks for {cells} cells; the limit is {limit} (max_cells_per_request)",
            type="less_than_equal",
            input=cells,
            ctx={"le": limit},
        )


def _check_draws(settings: Settings, cells: int, n_samples: int) -> None:
    """Several draws of each cell are that many cells against ``max_cells_per_request``."""
    limit = settings.max_cells_per_request
    if cells * n_samples > limit:
        raise FieldError(
            ["body", "n_samples"],
            f"the request asks for {cells} cells x {n_samples} draws = {cells * n_samples} cell "
            f"draws; the limit is {limit} (max_cells_per_request); ask for fewer draws or cells",
            type="less_than_equal",
            input=n_samples,
            ctx={"le": limit // cells},
        )


# 2. request -> plan -> one engine job ---------------------------------------------------------


@dataclass(frozen=True)
class PlannedJob:
    """An engine job plus what encoding its result needs."""

    plan: Plan
    job: EngineJob
    options: SamplingOptions  # the body
    timeout_s: float

    @property
    def cells(self) -> pd.DataFrame:
        """One row per cell (the plan's columns), in cell order."""
        return self.plan.cells

    @property
    def control(self) -> str | None:
        """The control label, when the request has control cells."""
        control = self.plan.loaded.config.control_label
        return control if control in (self.plan.request.conditions or ()) else None

    @property
    def observed_genes(self) -> tuple[str, ...]:
        imputed = self.plan.request.imputation
        return () if imputed is None else imputed.genes

    @property
    def dropped_genes(self) -> tuple[str, ...]:
        imputed = self.plan.request.imputation
        return () if imputed is None else imputed.dropped_genes


def plan_body(
    loaded: LoadedModel,
    settings: Settings,
    body: SamplingOptions,
    clock: Callable[[], float] = time.monotonic,
    *,
    arrived: float | None = None,
) -> PlannedJob:
    """The body's request (``to_request``), planned once, as one engine job with a deadline on
    ``clock`` (the engine's, ``Engine.clock``) covering every draw of every cell when it asks for
    several (``Plan.all_draws_job``: the cost admission then counts them all). The deadline
    counts from ``arrived`` (on ``clock``; default now): a request that waited for its model to
    load has that much less time, and one whose deadline passed meanwhile gets
    ``DeadlineExceeded``. Which model serves the body is ``server.model_host``'s choice."""
    try:
        request = to_request(body, loaded, settings)
        # planning checks the options against the model too (a sampler its graph cannot take)
        planned = _plan(loaded, request, _names_loc(body))
    except OptionError as err:  # the one place a sampling option's error gets its loc
        field = err.field
        raise FieldError(["body", field], str(err), input=getattr(body, field, None)) from None
    timeout = _timeout(body, settings)
    now = clock()
    start = now if arrived is None else arrived
    if now > start + timeout:
        raise DeadlineExceeded(
            f"the request's deadline ({timeout:g} s) passed while its model loaded "
            f"({now - start:.1f} s); retry now that it is loaded, or raise timeout_s"
        )
    job = planned.all_draws_job(deadline=start + timeout)
    return PlannedJob(planned, job, body, timeout)


def _timeout(body: SamplingOptions, settings: Settings) -> float:
    """The request's deadline in seconds: its own, at most the server's."""
    limit = settings.request_timeout_s
    return limit if body.timeout_s is None else min(body.timeout_s, limit)


def _names_loc(body: SamplingOptions) -> list[str | int]:
    """Where an unknown condition name of ``body`` is reported."""
    return ["body", "perturbations" if isinstance(body, PredictRequest) else "condition"]


def _plan(loaded: LoadedModel, request: GenerationRequest, names_loc: list[str | int]) -> Plan:
    try:
        return plan(loaded, request)
    except UnknownLabelError as err:
        loc: list[str | int] = ["body", "cell_type"] if err.kind == "cell type" else names_loc
        listed = names_loc[-1] == "perturbations" and err.name in (request.conditions or ())
        if err.kind != "cell type" and listed:
            loc = [*names_loc, (request.conditions or ()).index(err.name)]
        raise FieldError(
            loc,
            str(err),
            type=f"unknown_{err.kind.replace(' ', '_')}",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None


# 3. plan -> admission by cost -----------------------------------------------------------------

# Admission prices a forward this much above the measured median: the forward time varies with
# what else the machine runs (the event loop's own work included), and a request admitted on an
# estimate that just fits would end in a 504 (scripts/overload_check.py, 2 minutes of mixed
# load on a 2-core machine: 2-3 of about 300 at 1.0 and 1.25; at 1.5 none in several CI runs,
# then one of 321 in another, answered at 10.1 s on a 10 s deadline).
COST_MARGIN = 1.75


def check_cost(service: Service, planned: PlannedJob) -> None:
    """Admission by cost, against the work already admitted.

    A request above ``max_cell_steps``, or one that could not end by its deadline even alone
    at the engine's measured forward time, gets a 422 ``too_costly`` (it would only hold the
    engine and end in a 504). One that could, but not behind what is in flight and queued
    (``Workload.finish_seconds``: the engine's sharing played forward), gets a 429 whose
    Retry-After is the wait after which it would fit (``Workload.wait_before_fit``). Both price
    a forward at ``COST_MARGIN`` times the measured one."""
    job = planned.job
    limit, cost = service.settings.max_cell_steps, job.num_cells * job.sampling.steps
    if limit is not None and cost > limit:
        raise FieldError(
            ["body"],
            f"this request asks for {cost} cell-steps ({job.num_cells} cells x "
            f"{job.sampling.steps} steps); the server takes at most {limit} (max_cell_steps); "
            "ask for fewer cells or steps",
            type="too_costly",
            ctx={"cell_steps": cost, "max_cell_steps": limit},
        )
    workload, deadline = service.engine.workload(), planned.timeout_s
    if workload is None:  # no forward timed yet (the warm-up failed): nothing to price with
        return
    forward_ms = 1000 * workload.forward_seconds
    workload = dataclasses.replace(workload, forward_seconds=workload.forward_seconds * COST_MARGIN)
    new = Work.of_queued(job, now=service.engine.clock())
    alone = workload.alone_seconds(new)
    if alone > new.deadline:
        raise FieldError(
            ["body"],
            f"this request needs about {alone:.0f} s of model time ({job.num_cells} cells x "
            f"{job.sampling.steps} steps at {forward_ms:.0f} ms a forward of {workload.block_rows} "
            f"rows, priced {COST_MARGIN:g}x for its variation), longer than its deadline of "
            f"{deadline:g} s; ask for fewer cells or steps, or a longer timeout_s (up to the "
            "server's request_timeout_s)",
            type="too_costly",
            ctx={"estimated_s": round(alone, 1), "deadline_s": deadline},
        )
    wait = workload.wait_before_fit(new)
    if wait > 0:
        raise Overloaded(
            f"the requests already admitted would keep this one past its deadline of "
            f"{deadline:g} s (it needs about {alone:.1f} s alone); retry after "
            f"{math.ceil(wait)} s, or ask for fewer cells or steps or a longer timeout_s",
            wait,
        )
