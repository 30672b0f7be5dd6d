"""Response bodies of the service's routes: cells, per-perturbation results, model cards,
health, and the error body every route documents. The requests: ``server.schemas``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from sedd.defaults import TimeGrid
from server.schemas import SamplerName


class PrecisionRecord(BaseModel):
    """docs/precision.md rule 8; ``fp32_fallbacks`` counts this request's rows only."""

    amp_dtype: str
    weight_dtype: str
    tf32: bool
    device: str
    torch_version: str
    fp32_fallbacks: int


class EngineRecord(BaseModel):
    block_rows: int | None
    tokens_per_forward: int | None
    rows_per_tick: int


class ResponseMetadata(BaseModel):
    job_id: str
    seed: int
    steps: int
    time_grid: TimeGrid
    sampler: SamplerName
    temperature: float
    precision: PrecisionRecord
    entropy_bound: float | None = Field(
        default=None, description="sampler entropy only: its bound (nats); steps is its cap"
    )
    queue_seconds: float
    compute_seconds: float
    forwards: int
    forwards_per_cell: float = Field(description="model forwards a cell took, on average")
    genes_per_forward: float = Field(
        description="genes a cell drew from the mask per forward, on average"
    )
    checkpoint_sha256: str
    model: str = Field(default="", description="the id of the model that answered")
    scale: Literal["counts"] = Field(
        default="counts",
        description="what `counts` (and any mean layer) hold: raw counts, never log1p-CP10k",
    )
    engine: EngineRecord = Field(
        description="what the server's engine ran: rows and tokens of every model forward (its "
        "fixed shape, which decides the cells) and the most rows a tick steps"
    )


class CellLabels(BaseModel):
    """One cell's row of the .h5ad's obs: the same names and values as ``sedd generate`` writes."""

    name: str = Field(description="the cell's obs name: <run id>-<cell index>")
    condition: str | None = Field(None, description="the model's label (cell type or perturbation)")
    perturbation: str | None = Field(None, description="the label again, for perturbation models")
    sample_idx: int = Field(description="the cell's number within its condition")
    cell_type: str | None = None
    seed: int = Field(description="the request's seed; with cell_index it fixes the cell")
    cell_index: int = Field(description="the cell's random stream: cell i draws from (seed, i)")


class GenerateResponse(BaseModel):
    genes: list[str]
    counts: list[list[int]] = Field(description="(cells, genes) integer counts")
    cells: list[CellLabels]
    metadata: ResponseMetadata


class PerturbationResult(BaseModel):
    name: str
    is_control: bool
    counts: list[list[int]]
    mean: list[float] = Field(description="per-gene mean count over this perturbation's cells")
    shift_vs_control: list[float] | None = Field(
        default=None, description="mean minus the control's mean (when control cells exist)"
    )


class PredictResponse(BaseModel):
    genes: list[str]
    control: str | None
    perturbations: list[PerturbationResult]
    metadata: ResponseMetadata


class ImputeResponse(BaseModel):
    genes: list[str]
    counts: list[list[int]] = Field(description="given counts kept, the rest sampled")
    observed_genes: list[str]
    dropped_genes: list[str] = Field(
        default_factory=list, description="genes of the request the model does not have (ignored)"
    )
    cells: list[CellLabels]
    metadata: ResponseMetadata
    mean_of_draws: list[list[float]] | None = Field(
        default=None,
        description="(cells, genes) per-cell mean over the request's n_samples draws (float32 "
        "values); present only when n_samples > 1",
    )
    expected_counts: list[list[float]] | None = Field(
        default=None,
        description="(cells, genes) per-cell expected counts: per draw, each sampled gene's "
        "mean count under the distribution it was drawn from, averaged over the n_samples "
        "draws (float32 values; observed genes: their count); present only when `expected`",
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    loaded: Literal[True] = True
    path: str
    architecture: str
    num_parameters: int
    num_genes: int
    genes: list[str]
    max_count: int
    label_kind: Literal["perturbation", "cell_type", "other"] = Field(
        description="what the conditions are: perturbations, cell types or other labels"
    )
    label_key: str | None = Field(description="the obs column the labels were trained from")
    conditions: list[str] | None = Field(description="the names `condition` takes")
    default_condition: str | None = Field(
        description="what /generate and /impute use without a `condition`"
    )
    perturbations: list[str] | None = Field(description="perturbation models only")
    control_label: str | None = Field(description="perturbation models only")
    cell_types: list[str] | None
    checkpoint_sha256: str
    precision: PrecisionRecord
    limits: dict[str, float | int]
    default_schedule: dict[str, str | int | float] = Field(
        description="what a body that names no steps, time_grid or sampler runs: the model's "
        "calibrated schedule (sedd calibrate), else the library's default"
    )
    schedule_calibrated: bool = Field(
        description="whether default_schedule is the model's own calibration"
    )


class UnloadedModel(BaseModel):
    """A served model not loaded now: it loads on its first request (its card then)."""

    id: str
    object: Literal["model"] = "model"
    loaded: Literal[False] = False
    path: str
    default: bool = False


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard | UnloadedModel]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    queued_jobs: int
    active_jobs: int
    active_rows: int
    seconds_since_step: float | None


class ErrorBody(BaseModel):
    detail: str | list[dict[str, Any]]
