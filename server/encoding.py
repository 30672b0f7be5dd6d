"""Engine results -> response bodies ("encode"): JSON models or ``.h5ad`` bytes.

Counts come from ``sedd.io.tokens.tokens_to_counts`` (which refuses a leftover mask token); means
and shifts are computed from integer counts, so every number in a body is finite.
"""

from __future__ import annotations

import asyncio
import errno
import math
import tempfile
from pathlib import Path

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from sedd.engine import JobResult, engine_record
from sedd.io.tokens import tokens_to_counts
from sedd.io.write import write_cells_h5ad
from sedd.request.draws import EXPECTED_LAYER, MEAN_LAYER, mean_of_draws
from sedd.request.provenance import run_provenance
from server.errors import StorageFull
from server.intake import PlannedJob
from server.responses import (
    CellLabels,
    GenerateResponse,
    ImputeResponse,
    PerturbationResult,
    PredictResponse,
    ResponseMetadata,
)
from server.state import Service

H5AD_MEDIA_TYPE = "application/x-hdf5"


def finite_or_zero(value: float) -> float:
    """Timings for the response: never NaN/Inf in a body."""
    return value if math.isfinite(value) else 0.0


def wants_h5ad(planned: PlannedJob, request: Request) -> bool:
    """The ``format`` field when the body gives it; else the ``Accept`` header: h5ad when it
    names ``application/x-hdf5`` with a q-value above 0 and at least JSON's."""
    if "format" in planned.options.model_fields_set:
        return planned.options.format == "h5ad"
    header = request.headers.get("accept", "")
    if H5AD_MEDIA_TYPE not in header:
        return False
    h5ad, json_q = _quality(header, H5AD_MEDIA_TYPE), _quality(header, "application/json")
    return h5ad > 0 and h5ad >= json_q


def _quality(header: str, media_type: str) -> float:
    """The q-value ``header`` (an HTTP Accept) gives ``media_type``: that of its most specific
    matching range (type/subtype, then type/*, then */*), 0 when none matches."""
    kind = media_type.split("/")[0]
    best: tuple[int, float] = (-1, 0.0)
    for part in header.split(","):
        name, *params = (piece.strip() for piece in part.split(";"))
        specificity = {media_type: 2, f"{kind}/*": 1, "*/*": 0}.get(name.lower())
        if specificity is None or specificity < best[0]:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = min(max(float(value), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        best = (specificity, q)
    return best[1]


def counts_of(service: Service, result: JobResult) -> np.ndarray:
    return tokens_to_counts(result.tokens, service.loaded.config.tokens.mask_index)  # (N, G)


def draws_of(
    service: Service, planned: PlannedJob, result: JobResult
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the first draw's (N, G) counts, the (N, G) float32 layers: ``MEAN_LAYER``, the mean
    over several draws, and ``EXPECTED_LAYER``, the mean of the draws' expected counts, each
    only when asked for) of a job holding every draw (``Plan.all_draws_job``)."""
    counts, request = counts_of(service, result), planned.plan.request
    draws, layers = request.n_samples, {}
    if draws > 1:
        layers[MEAN_LAYER] = mean_of_draws(counts, draws)
    if request.expected and result.expected is not None:
        layers[EXPECTED_LAYER] = mean_of_draws(result.expected.numpy(), draws)
    return counts[: len(planned.cells)], layers


def metadata(service: Service, planned: PlannedJob, result: JobResult, job_id: str) -> dict:
    request = planned.plan.request  # the schedule as resolved
    return ResponseMetadata(
        job_id=job_id,
        seed=request.sampling.seed,
        steps=request.sampling.steps,
        time_grid=request.sampling.time_grid,
        sampler=request.sampling.sampler,
        temperature=request.sampling.temperature,
        entropy_bound=request.sampling.entropy_bound
        if request.sampling.sampler == "entropy"
        else None,
        precision=service.precision_record(result.fp32_fallbacks),  # type: ignore[arg-type]
        queue_seconds=finite_or_zero(result.queue_seconds),
        compute_seconds=finite_or_zero(result.compute_seconds),
        forwards=int(result.forwards),
        forwards_per_cell=finite_or_zero(result.forwards_per_cell),
        genes_per_forward=finite_or_zero(result.genes_per_forward),
        checkpoint_sha256=service.loaded.file_hash,
        model=service.model_id,
        engine=engine_record(service.engine),  # type: ignore[arg-type]
    ).model_dump()


def _cell_labels(planned: PlannedJob) -> list[CellLabels]:
    """Each cell's labels as the .h5ad's obs has them: ``condition`` (and ``perturbation`` for
    perturbation models), its number within the condition, cell type, seed, stream and name."""
    cells = planned.cells
    records = cells.to_dict(orient="records")
    return [
        CellLabels(
            **{key: row[key] for key in _LABEL_FIELDS if key in row},
            sample_idx=int(row["sample_idx"]),
            seed=int(row["seed"]),
            cell_index=int(row["cell_index"]),
            name=str(name),
        )
        for name, row in zip(cells.index, records, strict=True)
    ]


_LABEL_FIELDS = ("condition", "perturbation", "cell_type")


def generate_body(service: Service, planned: PlannedJob, result: JobResult, job_id: str) -> dict:
    counts = counts_of(service, result)
    return GenerateResponse(
        genes=list(service.loaded.config.genes),
        counts=counts.tolist(),
        cells=_cell_labels(planned),
        metadata=metadata(service, planned, result, job_id),  # type: ignore[arg-type]
    ).model_dump()


def impute_body(service: Service, planned: PlannedJob, result: JobResult, job_id: str) -> dict:
    """The first draw's counts; with several draws also their mean (``mean_of_draws``), with
    ``expected`` the expected counts (``expected_counts``): keys left out unless asked for, so
    a body that asks for neither is what it always was."""
    counts, layers = draws_of(service, planned, result)
    mean, expected = layers.get(MEAN_LAYER), layers.get(EXPECTED_LAYER)
    body = ImputeResponse(
        genes=list(service.loaded.config.genes),
        counts=counts.tolist(),
        observed_genes=list(planned.observed_genes),
        dropped_genes=list(planned.dropped_genes),
        cells=_cell_labels(planned),
        metadata=metadata(service, planned, result, job_id),  # type: ignore[arg-type]
        mean_of_draws=None if mean is None else mean.tolist(),
        expected_counts=None if expected is None else expected.tolist(),
    ).model_dump()
    for key, value in (("mean_of_draws", mean), ("expected_counts", expected)):
        if value is None:
            del body[key]
    return body


def predict_body(service: Service, planned: PlannedJob, result: JobResult, job_id: str) -> dict:
    """Cells grouped by perturbation, with per-gene means and the shift versus control."""
    counts = counts_of(service, result)
    names = planned.cells["condition"].to_numpy()
    order = list(dict.fromkeys(names.tolist()))  # request order, control last
    groups = {name: counts[names == name] for name in order}
    means = {name: group.mean(axis=0) for name, group in groups.items()}  # (G,) float64
    control_mean = means.get(planned.control) if planned.control is not None else None
    results = [
        PerturbationResult(
            name=name,
            is_control=name == planned.control,
            counts=groups[name].tolist(),
            mean=means[name].tolist(),
            shift_vs_control=None if control_mean is None else _list(means[name] - control_mean),
        )
        for name in order
    ]
    return PredictResponse(
        genes=list(service.loaded.config.genes),
        control=planned.control,
        perturbations=results,
        metadata=metadata(service, planned, result, job_id),  # type: ignore[arg-type]
    ).model_dump()


def _list(values: np.ndarray) -> list[float]:
    return [float(v) for v in values]


def _write_h5ad(service: Service, planned: PlannedJob, result: JobResult, route: str) -> bytes:
    """The same ``uns`` as ``sedd generate``'s file (request, model, precision record), with
    the server's timings and route."""
    timings = {
        "queue_seconds": finite_or_zero(result.queue_seconds),
        "compute_seconds": finite_or_zero(result.compute_seconds),
        "forwards": int(result.forwards),
        "forwards_per_cell": finite_or_zero(result.forwards_per_cell),
        "genes_per_forward": finite_or_zero(result.genes_per_forward),
        "fp32_fallbacks": int(result.fp32_fallbacks),
    }
    uns = run_provenance(
        service.loaded, planned.plan.request, service.precision, timings,
        {"route": route, "model_id": service.model_id},
        engine=engine_record(service.engine),
    )  # fmt: skip
    counts, layers = draws_of(service, planned, result)
    try:
        with tempfile.TemporaryDirectory(prefix="sedd-h5ad-") as tmp:
            path = write_cells_h5ad(
                Path(tmp) / "cells.h5ad", counts, service.loaded.config.genes, planned.cells,
                uns, var=planned.plan.var(), layers=layers,
            )  # fmt: skip
            return path.read_bytes()
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        raise StorageFull(
            f"no room for this .h5ad answer in the server's temporary directory "
            f"({tempfile.gettempdir()}: {err.strerror}); retry later, or ask for JSON "
            "(format: json); operators: free space there or point TMPDIR at a larger disk"
        ) from None


async def h5ad_response(
    service: Service, planned: PlannedJob, result: JobResult, route: str
) -> Response:
    """The cells as an ``.h5ad`` file (written off the event loop)."""
    data = await asyncio.to_thread(_write_h5ad, service, planned, result, route)
    name = route.strip("/").replace("/", "_") or "cells"
    return Response(
        data,
        media_type=H5AD_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{name}.h5ad"'},
    )
