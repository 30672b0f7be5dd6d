"""What the batching engine (``sedd.engine``) takes and gives back: jobs, results, errors.

An ``EngineJob`` is one request's rows resolved to tensors (``sedd.request.plan.Plan.job``
builds them from a planned request: cell i on random stream (seed, i),
``sedd.diffusion.randomness``); ``validate_job`` checks one against the model's ``ModelLimits``
before it is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from sedd.defaults import DEFAULT_BATCH_SIZE, SamplingOptions
from sedd.diffusion.expected import check_expected
from sedd.diffusion.graph import Graph
from sedd.diffusion.inputs import ModelLimits, check_inputs
from sedd.diffusion.steps import check_step_kind, step_kind

Outcome = Literal["ok", "cancelled", "timeout", "error"]


@dataclass(frozen=True, eq=False)
class EngineJob:
    """One request's rows, already resolved to tensors.

    Pass CPU tensors: ``submit`` validates them on the caller's thread (without waiting on the
    accelerator), and the engine thread moves the rows it steps to the device.
    """

    num_cells: int
    # steps, time grid, reverse step, temperature, seed: the request's value, carried whole
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    first_cell: int = 0  # cell i of the job draws from stream (seed, first_cell + i)
    labels: torch.Tensor | None = None  # (N,) long perturbation indices, or (N, E) float vectors
    cell_types: torch.Tensor | None = None  # (N,) long
    x_init: torch.Tensor | None = None  # (N, G) tokens for imputation (mask elsewhere)
    fixed: torch.Tensor | None = None  # (N, G) bool, positions never changed
    deadline: float | None = None  # time.monotonic() deadline; past it the job fails
    eps: float = 1e-5  # the grid ends at t = eps (``sedd.diffusion.sampling.time_grid``)
    denoise: bool = True  # the final step from eps to 0; without it masks may remain
    # also give each gene's expected count: the mean of the distribution it was drawn from
    # (``sedd.diffusion.expected``; ``JobResult.expected``); it never changes a token
    expected: bool = False

    @property
    def total_steps(self) -> int:
        """The most steps (forwards) a row takes, the final denoise included: its step kind's
        bound (``ReverseStep.forwards``), which admission prices the job by. Under the
        absorbing graph a row whose genes are all drawn leaves earlier."""
        return step_kind(self.sampling.sampler).forwards(self.sampling.steps, self.denoise)


@dataclass(frozen=True)
class EngineSettings:
    """How an offline run sets up its engine; never part of a request.

    ``batch_size``: cells a job, and the rows one tick steps (rounded up to whole forward
    blocks): memory, never a cell. ``tokens_per_forward``: rows x genes a model forward (None:
    the device's default); its rows are every forward's fixed shape, which decides the cells, as
    the precision does, so outputs record the shape the engine used. ``cuda_graphs``: replay each
    block from a captured CUDA graph (None: ``SEDD_CUDA_GRAPHS``, else off); never a cell.
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    tokens_per_forward: int | None = None
    cuda_graphs: bool | None = None
    threads: int | None = None  # torch threads to sample on (None: SEDD_THREADS, else as is)

    def __post_init__(self) -> None:
        budget = self.tokens_per_forward
        for name, ok, rule in (
            ("batch_size", isinstance(self.batch_size, int) and self.batch_size >= 1, ">= 1"),
            ("tokens_per_forward", budget is None or (isinstance(budget, int) and budget >= 1),
             ">= 1 (or None: the device's default)"),
            ("threads", self.threads is None or (isinstance(self.threads, int)
                                                and not isinstance(self.threads, bool)
                                                and self.threads >= 1), ">= 1 (or None)"),
        ):  # fmt: skip
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {getattr(self, name)!r}.")


@dataclass
class JobResult:
    tokens: torch.Tensor  # (N, G) long, CPU
    queue_seconds: float  # submit -> first rows admitted
    compute_seconds: float  # first rows admitted -> done
    forwards: int  # model forwards (calls) the job's rows took part in
    fp32_fallbacks: int  # the job's rows recomputed in fp32 (docs/precision.md rule 5)
    row_forwards: int = 0  # forwards summed over the job's cells (a cell's rows in each)
    genes_committed: int = 0  # positions drawn from the mask (absorbing graph), all cells
    # (N, G) float32, CPU: each gene's expected count (``EngineJob.expected``); else None
    expected: torch.Tensor | None = None

    @property
    def forwards_per_cell(self) -> float:
        """Model forwards a cell took, on average (what a cell cost)."""
        return self.row_forwards / max(self.tokens.shape[0], 1)

    @property
    def genes_per_forward(self) -> float:
        """Genes committed per cell forward, on average (0 for the uniform graph)."""
        return self.genes_committed / max(self.row_forwards, 1)


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


class BlockOutOfMemoryError(torch.OutOfMemoryError):
    """Out of device memory in a block step of one job alone, with the setting that lowers it.

    Persistent: every forward runs on whole blocks, so the same block runs out again on a retry
    until ``tokens_per_forward`` (rows x genes a block) is lowered, e.g. to ``suggested``."""

    def __init__(self, message: str, tokens_per_forward: int, suggested: int) -> None:
        super().__init__(message)
        self.tokens_per_forward = tokens_per_forward
        self.suggested = suggested


def is_out_of_memory(err: BaseException) -> bool:
    """True for an accelerator out-of-memory error (a function, so tests can widen it)."""
    return isinstance(err, torch.OutOfMemoryError)


def validate_job(
    job: EngineJob, limits: ModelLimits, graph: Graph, denoise: str = "sample"
) -> None:
    """Raise ``ValueError`` naming the field and value unless the model can run ``job``
    (``sedd.diffusion.inputs.check_inputs``, the check st3's sampler classes make too) on a
    sampler whose final denoise is ``denoise`` (``Sampler.denoise_mode``)."""
    if not isinstance(job.sampling, SamplingOptions):
        raise TypeError(f"`sampling` must be a SamplingOptions, got {type(job.sampling).__name__}.")
    check_step_kind(job.sampling, graph)
    check_expected(job.expected, graph, denoise)
    check_inputs(
        limits, graph, num_cells=job.num_cells, first_cell=job.first_cell, eps=job.eps,
        labels=job.labels, cell_types=job.cell_types, x_init=job.x_init, fixed=job.fixed,
    )  # fmt: skip
