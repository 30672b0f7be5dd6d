"""In-flight rows of the batching engine, and packing them into one ``Sampler`` step.

A job's rows join in blocks (``RowBlock``: rows [lo, hi) admitted at the same boundary, so on the
same step). A step takes a list of slices of blocks; every row brings its own t and s (its
job's ``time_grid(steps, eps)``, then s = 0 for the denoise), temperature, predictor,
conditioning and random stream (seed, cell, step), so the packed step is the solo step of each
row. Everything per row that the host knows (times, streams, settings) is laid out in NumPy and
copied to the device in one transfer per kind, so the ops a step launches do not grow with its
rows; what the host learns back (non-finite rows, positions left to unmask) is one small tensor
per tick (``Proposal.summary``), kept here as plain integers per row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from sedd.diffusion.graph import Graph
from sedd.diffusion.reference import StepProgress
from sedd.diffusion.sampling import (
    Proposal,
    Sampler,
    StepBranches,
    StepOutput,
    StepRows,
    start_tokens,
    time_grid,
)
from sedd.diffusion.steps import ReverseStep, kind_index, step_kind
from sedd.engine.jobs import EngineJob, JobHandle

_EMPTY = torch.empty(0)


@dataclass(eq=False)
class JobState:
    """An accepted job; its tensors are built at admission and touched by the engine thread."""

    job: EngineJob
    handle: JobHandle
    on_progress: Callable[[StepProgress], None] | None
    submitted: float  # time.monotonic()
    started: float | None = None  # first rows admitted
    x: torch.Tensor = _EMPTY  # (N, G) tokens on the device
    labels: torch.Tensor | None = None  # the job's conditioning, moved to the device once
    cell_types: torch.Tensor | None = None
    fixed: torch.Tensor | None = None
    expected: torch.Tensor | None = None  # (N, G) float32 on the device (``EngineJob.expected``)
    grid: list[float] = field(default_factory=list)  # (steps + 1) times, host floats
    active: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (N,) per row
    admitted: int = 0  # rows [0, admitted) have joined
    rows_done: int = 0
    forwards: int = 0
    fallbacks: int = 0
    row_forwards: int = 0  # forwards summed over the job's rows
    to_draw: int = 0  # positions to draw at admission (absorbing graph), all rows
    absorbing: bool = False  # under the absorbing graph a row with nothing masked is done
    done: bool = False  # its future is resolved

    def materialise(self, graph: Graph, num_genes: int | None, device: torch.device) -> None:
        """Time grid, initial tokens (t = 1, or the job's x_init) and conditioning on the device,
        and each row's count of positions that can change: built when rows first join."""
        if self.grid:
            return
        job = self.job
        if job.x_init is None:  # the uniform graph draws them from each cell's START stream
            if num_genes is None:  # validate_job refuses this; a guard, not a user error
                raise RuntimeError("a job without x_init needs the model's number of genes.")
            self.x = start_tokens(
                graph, job.num_cells, num_genes, device,
                seed=job.sampling.seed, first_cell=job.first_cell,
            )  # fmt: skip
            self.active = np.full(job.num_cells, num_genes, dtype=np.int64)
        else:
            x = job.x_init.to(dtype=torch.long)  # (N, G) on the CPU: counted without a sync
            active = graph.active_positions(x)
            if job.fixed is not None:
                active &= ~job.fixed
            self.active = active.sum(dim=1).numpy().astype(np.int64)
            self.x = x.to(device=device).clone()
        self.labels, self.cell_types, self.fixed = (
            None if v is None else v.to(device) for v in (job.labels, job.cell_types, job.fixed)
        )
        if job.expected:  # given genes: their own count; a drawn gene's is written as it commits
            self.expected = torch.where(self.x == graph.dim - 1, 0.0, self.x.float())
        self.absorbing = graph.absorb
        self.to_draw = int(self.active.sum()) if graph.absorb else 0
        self.grid = time_grid(job.sampling.steps, job.eps, job.sampling.time_grid).tolist()

    @property
    def kind(self) -> ReverseStep:
        """The job's kind of reverse step."""
        return step_kind(self.job.sampling.sampler)

    def progress(
        self, mine: list[RowBlock], graph: Graph, rows: int, finished: int
    ) -> StepProgress:
        """Where the job is, given its blocks still in flight (``mine``), the ``rows`` of it
        this step moved and the cells that ``finished`` with it; from host counts, no device
        read."""
        total = self.job.total_steps
        done = self.admitted == self.job.num_cells
        step = min((blk.step for blk in mine), default=total) if done else 0
        masked, unmasked = 0.0, step / max(total, 1)
        if graph.absorb:  # masked positions are the ones that can change (fixed never are)
            left = float(self.active.sum())
            masked = left / max(self.x.numel(), 1)
            unmasked = 1 - left / self.to_draw if self.to_draw else 1.0
        return StepProgress(step, total, rows, masked, finished, unmasked)


@dataclass(eq=False)
class RowBlock:
    """Rows [lo, hi) of a job, admitted together and on the same step."""

    state: JobState
    lo: int
    hi: int
    step: int = 0  # steps taken; the block is done after steps + 1 (the denoise)

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def finished(self) -> bool:
        """Past its last step, or (absorbing graph) with every gene of its rows drawn: no
        later step changes such a row, so it leaves and its room goes to waiting work."""
        if self.step >= self.state.job.total_steps:
            return True
        return self.state.absorbing and not self.has_work

    def working(self) -> list[RowBlock]:
        """This block as runs of the rows that still have work (absorbing graph: the rows
        whose genes are all drawn are done and leave); itself when every row has work."""
        busy = self.state.active[self.lo : self.hi] > 0
        if not self.state.absorbing or busy.all():
            return [self]
        edges = np.flatnonzero(np.diff(np.concatenate(([0], busy.astype(np.int8), [0]))))
        return [RowBlock(self.state, self.lo + int(a), self.lo + int(b), self.step)
                for a, b in zip(edges[::2], edges[1::2], strict=True)]  # fmt: skip

    @property
    def has_work(self) -> bool:
        """Whether any of its rows has a position left that can change."""
        return bool(self.state.active[self.lo : self.hi].any())

    def times(self) -> tuple[float, float]:
        """(t, s) of this block's next step; s = 0 is the final denoise. An adaptive kind reads
        each row's time off its tokens: (1, 1), unused."""
        if self.state.kind.adaptive:
            return 1.0, 1.0
        grid, steps = self.state.grid, self.state.job.sampling.steps
        s = 0.0 if self.step >= steps else grid[self.step + 1]
        return grid[self.step], s


Slice = tuple[RowBlock, int, int]  # rows [a, b) of a block, counted from block.lo


def halves(slices: list[Slice]) -> tuple[list[Slice], list[Slice]]:
    """Split slices of two or more jobs into two runs of whole jobs, about half the rows each."""
    jobs: dict[int, list[Slice]] = {}
    for sl in slices:
        jobs.setdefault(id(sl[0].state), []).append(sl)
    groups = list(jobs.values())
    total = sum(b - a for _, a, b in slices)
    first: list[Slice] = []
    while len(groups) > 1 and (not first or 2 * sum(b - a for _, a, b in first) < total):
        first.extend(groups.pop(0))
    return first, [sl for group in groups for sl in group]


@dataclass(eq=False)
class Packed:
    """Slices stepped together on the device, waiting for the tick's readback."""

    slices: list[Slice]
    rows: StepRows
    branches: StepBranches
    proposal: Proposal
    started: float  # time.perf_counter() when proposed


def upload(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """``values`` on ``device`` without making the host wait: on CUDA through page-locked memory
    with a non-blocking copy (a copy from pageable memory waits for the device's queue)."""
    host = torch.from_numpy(values)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def pack(sampler: Sampler, slices: list[Slice]) -> tuple[StepRows, StepBranches]:
    """The slices' rows as one ``StepRows`` on the sampler's device, and their ``StepBranches``.

    Per-row numbers are laid out in NumPy and cross to the device in two asynchronous copies
    (``upload``); tensors are sliced per slice (a job's run of rows), never per row.
    """
    device = sampler.device
    spans = [(blk, blk.lo + a, blk.lo + b) for blk, a, b in slices]  # rows of each job
    total = sum(hi - lo for _, lo, hi in spans)
    reals = np.empty((4, total), dtype=np.float64)  # t, s, temperature, entropy bound
    ints = np.empty((5, total), dtype=np.int64)  # seed, cell, step, kind, steps left
    offset, settings = 0, []
    for blk, lo, hi in spans:
        job, (t, s), end = blk.state.job, blk.times(), offset + hi - lo
        options = job.sampling
        reals[:, offset:end] = np.array([t, s, options.temperature, options.entropy_bound])[:, None]
        ints[0, offset:end] = options.seed
        ints[1, offset:end] = np.arange(job.first_cell + lo, job.first_cell + hi)
        ints[2, offset:end] = blk.step
        ints[3, offset:end] = kind_index(options.sampler)
        ints[4, offset:end] = job.total_steps - blk.step
        settings.append((s, options.sampler, options.temperature))
        offset = end
    real, integer = upload(reals, device), upload(ints, device)

    def rows_of(pick: Callable[[JobState], torch.Tensor | None]) -> torch.Tensor | None:
        parts = [(pick(blk.state), lo, hi) for blk, lo, hi in spans]
        present = [v[lo:hi] for v, lo, hi in parts if v is not None]
        # the engine packs only jobs with the same kind of conditioning: all or none
        return torch.cat(present) if present and len(present) == len(parts) else None

    fixed = None
    if any(blk.state.fixed is not None for blk, _, _ in spans):
        width = spans[0][0].state.x.shape[1]
        none_fixed = torch.zeros(1, width, dtype=torch.bool, device=device)
        fixed = rows_of(
            lambda st: none_fixed.expand(st.job.num_cells, -1) if st.fixed is None else st.fixed
        )
    expected = None  # rows of jobs that do not ask for it carry zeros, never read back
    if any(blk.state.expected is not None for blk, _, _ in spans):
        width = spans[0][0].state.x.shape[1]
        zeros = torch.zeros(1, width, device=device)
        expected = rows_of(
            lambda st: zeros.expand(st.job.num_cells, -1) if st.expected is None else st.expected
        )
    rows = StepRows(
        x=torch.cat([blk.state.x[lo:hi] for blk, lo, hi in spans]),  # (B, G)
        t=real[0],
        s=real[1],
        seed=integer[0],
        cell=integer[1],
        step=integer[2],
        temperature=real[2].float(),
        kind=integer[3],
        entropy_bound=real[3],
        steps_left=integer[4],
        fixed=fixed,
        labels=rows_of(lambda st: st.labels),
        cell_types=rows_of(lambda st: st.cell_types),
        expected=expected,
    )
    s_values, kinds, temperatures = zip(*settings, strict=True)
    return rows, StepBranches.of_values(s_values, kinds, temperatures)


def propose_slices(sampler: Sampler, slices: list[Slice]) -> Packed:
    """Step the slices' rows on the device (no host sync); raises whatever the step raises."""
    started = time.perf_counter()
    rows, branches = pack(sampler, slices)
    return Packed(slices, rows, branches, sampler.propose(rows, branches), started)


def settle_packed(
    sampler: Sampler, packed: Packed, summary: list[list[int]]
) -> tuple[int, float, int]:
    """Finish a packed step given its rows' readback, and write the new tokens into each job.

    Returns (rows, seconds, model calls). Each job counts the model calls its rows were in and
    its fp32 fallback rows. Raises whatever settling raises, before writing anything back.
    """
    out: StepOutput = sampler.settle(packed.rows, packed.branches, packed.proposal, summary)
    seconds = time.perf_counter() - packed.started
    fallbacks, active = out.fp32_fallback_rows, out.active
    offset, size = 0, sampler.block_rows or packed.rows.num_rows
    blocks_of: dict[int, set[int]] = {}  # job -> the row blocks its rows were in
    for blk, a, b in packed.slices:
        lo, hi, st = blk.lo + a, blk.lo + b, blk.state
        st.row_forwards += hi - lo
        st.x[lo:hi] = out.tokens[offset : offset + hi - lo]
        if st.expected is not None and out.expected is not None:
            st.expected[lo:hi] = out.expected[offset : offset + hi - lo]
        st.active[lo:hi] = active[offset : offset + hi - lo]
        st.fallbacks += sum(1 for row in fallbacks if offset <= row < offset + hi - lo)
        mine = blocks_of.setdefault(id(st), set())
        mine.update(range(offset // size, (offset + hi - lo - 1) // size + 1))
        offset += hi - lo
    for blk, _, _ in packed.slices:
        blk.state.forwards += len(blocks_of.pop(id(blk.state), ()))
    return packed.rows.num_rows, seconds, out.model_calls
