"""Requests -> engine jobs ("decode"): a body's one conversion, then the library's one plan.

Each body converts itself (``to_request``: the server's limits, the model's names) into the
library's request type, and ``plan_body`` plans it with the library's one planning call
(``sedd.request.plan.plan``): cell i of a request draws from the stream (seed, i), so a
request's cells equal those of the Python API and ``sedd generate`` for the same parameters.
Name errors become ``FieldError`` naming the field.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd

from sedd.checkpoints import LoadedModel, UnknownLabelError
from sedd.defaults import OptionError
from sedd.engine import EngineJob
from sedd.request.plan import GenerationRequest, Plan, plan
from server.config import Settings
from server.errors import FieldError, ModelNotServed
from server.schemas import SamplingOptions


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


def plan_body(loaded: LoadedModel, settings: Settings, body: SamplingOptions) -> PlannedJob:
    """The body's request (``to_request``), planned once, as one engine job with a deadline
    (every draw of every cell when it asks for several, ``Plan.all_draws_job``: the cost
    admission then counts them all). A body whose ``model`` names another model than the
    served one raises ``ModelNotServed``."""
    if body.model is not None and body.model != loaded.path.name:
        raise ModelNotServed(body.model, loaded.path.name)
    try:
        request = body.to_request(loaded, settings)
    except OptionError as err:  # the one place a sampling option's error gets its loc
        field = err.field
        raise FieldError(["body", field], str(err), input=getattr(body, field, None)) from None
    timeout = body.timeout(settings)
    planned = _plan(loaded, request, list(body.names_loc))
    job = planned.all_draws_job(deadline=time.monotonic() + timeout)
    return PlannedJob(planned, job, body, timeout)


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


def finite_or_zero(value: float) -> float:
    """Timings for the response: never NaN/Inf in a body."""
    return value if math.isfinite(value) else 0.0
