"""What the batching engine (``sedd.engine``) takes and gives back: jobs, results, errors.

An ``EngineJob`` is one request's rows resolved to tensors (``sedd.request.plan.Plan.job``
builds them from a planned request: cell i on random stream (seed, i),
``sedd.diffusion.randomness``); ``validate_job`` checks one against the model's ``JobLimits``
before it is queued.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from sedd.checkpoints import LoadedModel
from sedd.defaults import TIME_GRIDS, TimeGrid
from sedd.diffusion.graph import Graph
from sedd.diffusion.randomness import MAX_CELLS, MAX_SEED, MAX_STEPS
from sedd.diffusion.sampling import Predictor

Outcome = Literal["ok", "cancelled", "timeout", "error"]


@dataclass(frozen=True, eq=False)
class EngineJob:
    """One request's rows, already resolved to tensors.

    Pass CPU tensors: ``submit`` validates them on the caller's thread (without waiting on the
    accelerator), and the engine thread moves the rows it steps to the device.
    """

    num_cells: int
    steps: int
    sampler: Predictor = "euler"
    temperature: float = 1.0
    seed: int = 0
    first_cell: int = 0  # cell i of the job draws from stream (seed, first_cell + i)
    labels: torch.Tensor | None = None  # (N,) long perturbation indices, or (N, E) float vectors
    cell_types: torch.Tensor | None = None  # (N,) long
    x_init: torch.Tensor | None = None  # (N, G) tokens for imputation (mask elsewhere)
    fixed: torch.Tensor | None = None  # (N, G) bool, positions never changed
    deadline: float | None = None  # time.monotonic() deadline; past it the job fails
    eps: float = 1e-5  # the grid ends at t = eps (``sedd.diffusion.sampling.time_grid``)
    grid: TimeGrid = "uniform"  # how t falls from 1 to eps (``sedd.diffusion.sampling.time_grid``)
    denoise: bool = True  # the final step from eps to 0; without it masks may remain

    @property
    def total_steps(self) -> int:
        """Steps every row takes, the final denoise included."""
        return self.steps + (1 if self.denoise else 0)


@dataclass
class JobProgress:
    step: int  # steps done by every row of the job; the final denoise is step == steps
    steps: int  # total, the denoise included
    rows: int  # the job's rows this step moved
    fraction_masked: float  # of all the job's positions (0 for uniform graphs)


@dataclass
class JobResult:
    tokens: torch.Tensor  # (N, G) long, CPU
    queue_seconds: float  # submit -> first rows admitted
    compute_seconds: float  # first rows admitted -> done
    forwards: int  # model forwards (calls) the job's rows took part in
    fp32_fallbacks: int  # the job's rows recomputed in fp32 (docs/precision.md rule 5)


class EngineFull(Exception):
    """The bounded queue is full; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineStopped(Exception):
    """The engine is draining or stopped and takes no new jobs."""


class JobTimeout(Exception):
    """The job's deadline passed before it finished."""


class JobCancelled(Exception):
    """The job was cancelled (through its handle, or by a stop without drain)."""


def outcome_of(err: Exception | None) -> str:
    """How a job ended, for observers and metrics: ok, cancelled, timeout or error."""
    kinds = ((JobCancelled, "cancelled"), (JobTimeout, "timeout"))
    return "ok" if err is None else next((k for t, k in kinds if isinstance(err, t)), "error")


class InvalidTokensError(RuntimeError):
    """A finished job still holds mask or out-of-range tokens, so it is never returned."""


class EngineObserver(Protocol):
    """Hooks for monitoring; called on the engine thread, and their errors are only logged."""

    def on_forward(self, rows: int, seconds: float, calls: int) -> None:
        """A packed step of ``rows`` rows that took ``seconds`` and ran ``calls`` model
        forwards (its row blocks, plus any fp32 recomputation)."""

    def on_job_done(self, job: EngineJob, result: JobResult | None, outcome: str) -> None: ...


class JobHandle:
    """What ``Engine.submit`` returns: the job's future and a way to cancel it."""

    def __init__(self, job_id: int, wake: Callable[[], None]) -> None:
        self.job_id = job_id
        self.future: Future[JobResult] = Future()
        self.cancel_requested = False
        self._wake = wake

    def cancel(self) -> None:
        """Drop the job's rows at the next step boundary; the future gets ``JobCancelled``."""
        self.cancel_requested = True
        self._wake()


@dataclass(frozen=True)
class JobLimits:
    """What ``validate_job`` checks a job against. ``None``: not known, so not checked (a bare
    score module sampled through ``sedd.engine.samplers``)."""

    num_genes: int | None
    num_perturbations: int | None = None  # 0: unconditional
    label_dim: int | None = None  # length of precomputed perturbation vectors, if taken
    num_cell_types: int | None = None

    @classmethod
    def of_model(cls, loaded: LoadedModel) -> JobLimits:
        cfg = loaded.config
        return cls(
            num_genes=cfg.num_genes,
            num_perturbations=cfg.num_perturbations,
            label_dim=getattr(cfg.arch, "precomputed_emb_dim", None),
            num_cell_types=cfg.num_cell_types,
        )

    @classmethod
    def of_module(cls, model: object, num_genes: int | None = None) -> JobLimits:
        """Limits read from a module's attributes (st3's modules carry them), where present."""
        return cls(
            num_genes=num_genes if num_genes is not None else getattr(model, "num_genes", None),
            num_perturbations=getattr(model, "num_perturbations", None),
            label_dim=getattr(model, "precomputed_emb_dim", None),
            num_cell_types=getattr(model, "num_cell_types", None),
        )


class BlockOutOfMemoryError(torch.OutOfMemoryError):
    """Out of device memory in a block step, with the setting that lowers it."""


def is_out_of_memory(err: BaseException) -> bool:
    """True for an accelerator out-of-memory error (a function, so tests can widen it)."""
    return isinstance(err, torch.OutOfMemoryError)


def _bad(name: str, rule: str, value: object) -> ValueError:
    return ValueError(f"`{name}` must be {rule}, got {value}.")


def _span(values: torch.Tensor) -> str:
    return f"values in [{int(values.min())}, {int(values.max())}]"


def validate_job(job: EngineJob, limits: JobLimits, graph: Graph) -> None:
    """Raise ``ValueError`` naming the field and value unless the model can run ``job``.

    Label indices are range-checked here: an out-of-range embedding index on CUDA is a
    device-side assert that would take the whole engine down, not just this job.
    """
    n = job.num_cells
    for name, ok, rule in (
        ("num_cells", n >= 1, ">= 1"),
        ("steps", job.steps >= 1, ">= 1"),
        ("steps", job.steps < MAX_STEPS, "below 2**32"),
        ("temperature", math.isfinite(job.temperature) and job.temperature > 0, "finite, > 0"),
        ("seed", 0 <= job.seed <= MAX_SEED, "in [0, 2**63 - 1]"),
        ("first_cell", 0 <= job.first_cell <= MAX_CELLS - n, "in [0, 2**48 - num_cells]"),
        ("eps", 0.0 < job.eps < 1.0, "in (0, 1)"),
    ):
        if not ok:
            raise _bad(name, rule, getattr(job, name))
    if job.sampler not in ("euler", "analytic"):
        raise _bad("sampler", "'euler' or 'analytic'", repr(job.sampler))
    if job.grid not in TIME_GRIDS:
        raise _bad("grid", f"one of {', '.join(TIME_GRIDS)}", repr(job.grid))
    _validate_labels(job, limits, n)
    if job.x_init is None and limits.num_genes is None:
        raise _bad("x_init", "given, or the number of genes known", None)
    _validate_imputation(job, graph, n, limits.num_genes)


def _validate_labels(job: EngineJob, limits: JobLimits, n: int) -> None:
    labels, cell_types, perts = job.labels, job.cell_types, limits.num_perturbations
    if labels is None and perts:
        raise _bad("labels", "given: this model is conditioned on perturbations", None)
    if labels is not None and perts == 0:
        raise _bad("labels", "None: this model is unconditional", tuple(labels.shape))
    if labels is not None and labels.is_floating_point():
        dim = limits.label_dim
        shape_ok = labels.shape == (n, dim) if dim is not None else labels.ndim == 2
        if not shape_ok or labels.shape[0] != n or not bool(torch.isfinite(labels).all()):
            raise _bad("labels", f"finite vectors of shape ({n}, {dim})", tuple(labels.shape))
    elif labels is not None:
        if labels.shape != (n,):
            raise _bad("labels", f"of shape ({n},)", tuple(labels.shape))
        if labels.min() < 0 or (perts is not None and labels.max() >= perts):
            raise _bad("labels", f"indices in [0, {perts})", _span(labels))
    if cell_types is not None:
        if cell_types.shape != (n,) or cell_types.is_floating_point():
            raise _bad("cell_types", f"integer indices of shape ({n},)", tuple(cell_types.shape))
        kinds = limits.num_cell_types
        if cell_types.min() < 0 or (kinds is not None and cell_types.max() >= kinds):
            raise _bad("cell_types", f"indices in [0, {kinds})", _span(cell_types))


def _validate_imputation(job: EngineJob, graph: Graph, n: int, g: int | None) -> None:
    x, fixed, vocab = job.x_init, job.fixed, graph.dim
    if fixed is not None and x is None:
        raise _bad("x_init", "given when `fixed` is", None)
    if x is None:
        return
    g = x.shape[1] if g is None and x.ndim == 2 else g
    if x.shape != (n, g) or x.is_floating_point():
        raise _bad("x_init", f"integer tokens of shape ({n}, {g})", tuple(x.shape))
    if x.min() < 0 or x.max() >= vocab:
        raise _bad("x_init", f"tokens in [0, {vocab})", _span(x))
    if fixed is None:
        return
    if fixed.shape != (n, g) or fixed.dtype != torch.bool:
        raise _bad(
            "fixed", f"a bool tensor of shape ({n}, {g})", f"{fixed.dtype} {tuple(fixed.shape)}"
        )
    mask = graph.mask_index
    if mask is not None and bool((x[fixed] == mask).any()):
        raise _bad("fixed", "over real tokens, never the mask", "a fixed masked position")
