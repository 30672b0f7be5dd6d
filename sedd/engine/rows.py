"""In-flight rows of the batching engine, and packing them into one ``Sampler.step``.

A job's rows join in blocks (``RowBlock``: rows [lo, hi) admitted at the same boundary, so on the
same step). A forward takes a list of slices of blocks; every row brings its own t and s (its
job's ``time_grid(steps, eps)``, then s = 0 for the denoise), temperature, predictor,
conditioning and generator, so the packed step is the solo step of each row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sedd.engine.jobs import EngineJob, JobHandle, JobProgress
from sedd.graph import Graph
from sedd.sampling import Sampler, cell_generators, start_tokens, time_grid

_EMPTY = torch.empty(0)


@dataclass(eq=False)
class JobState:
    """An accepted job; its tensors are built at admission and touched by the engine thread."""

    job: EngineJob
    handle: JobHandle
    on_progress: Callable[[JobProgress], None] | None
    submitted: float  # time.monotonic()
    started: float | None = None  # first rows admitted
    x: torch.Tensor = _EMPTY  # (N, G) tokens on the device
    timesteps: torch.Tensor = _EMPTY  # (steps + 1,) fp64
    admitted: int = 0  # rows [0, admitted) have joined
    rows_done: int = 0
    forwards: int = 0
    fallbacks: int = 0
    done: bool = False  # its future is resolved

    def materialise(self, graph: Graph, num_genes: int | None, device: torch.device) -> None:
        """Time grid and initial tokens (t = 1, or the job's x_init), built when rows first join."""
        if self.timesteps.numel():
            return
        job = self.job
        self.timesteps = time_grid(job.steps, job.eps, job.grid)
        if job.x_init is None:  # the uniform graph draws them from stream 1 of each cell
            if num_genes is None:  # validate_job refuses this; a guard, not a user error
                raise RuntimeError("a job without x_init needs the model's number of genes.")
            shared = () if job.generator is None else (job.generator,)
            seed = job.seed if job.generator is None else None
            self.x = start_tokens(
                graph, job.num_cells, num_genes, device,
                seed=seed, first_cell=job.first_cell, generators=shared,
            )  # fmt: skip
        else:
            self.x = job.x_init.to(device=device, dtype=torch.long).clone()

    def progress(self, mine: list[RowBlock], graph: Graph, rows: int) -> JobProgress:
        """Where the job is, given its blocks still in flight (``mine``) and the ``rows`` of it
        this step moved."""
        total = self.job.total_steps
        done = self.admitted == self.job.num_cells
        step = min((blk.step for blk in mine), default=total) if done else 0
        masked = 0.0
        if graph.absorb:
            masked = float((self.x == graph.mask_index).float().mean())
        return JobProgress(step, total, rows, masked)


@dataclass(eq=False)
class RowBlock:
    """Rows [lo, hi) of a job, admitted together and on the same step."""

    state: JobState
    lo: int
    hi: int
    generators: list[torch.Generator] = field(default_factory=list)
    step: int = 0  # steps taken; the block is done after steps + 1 (the denoise)

    @property
    def rows(self) -> int:
        return self.hi - self.lo

    @property
    def finished(self) -> bool:
        return self.step >= self.state.job.total_steps

    def make_generators(self, device: torch.device) -> None:
        job = self.state.job
        if job.generator is not None:  # one stream for all the job's rows
            self.generators = [job.generator] * self.rows
            return
        cells = range(job.first_cell + self.lo, job.first_cell + self.hi)
        self.generators = cell_generators(job.seed, cells, device)

    def times(self) -> tuple[float, float]:
        """(t, s) of this block's next step; s = 0 is the final denoise."""
        grid, steps = self.state.timesteps, self.state.job.steps
        s = 0.0 if self.step >= steps else float(grid[self.step + 1])
        return float(grid[self.step]), s


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


def step_slices(sampler: Sampler, slices: list[Slice]) -> tuple[int, float, int]:
    """Step the slices' rows in one packed step; write the new tokens back into each job.

    Returns (rows, seconds, model calls). Each job counts the model calls its rows were in (a
    step whose rows are all unmasked calls the model 0 times), and its fp32 fallback rows.
    Raises whatever the step raises, before writing anything back.
    """
    device = sampler.device
    spans = [(blk, blk.lo + a, blk.lo + b) for blk, a, b in slices]  # rows of each job

    def constant(value: Callable[[RowBlock], float | bool], dtype: torch.dtype) -> torch.Tensor:
        parts = [torch.full((hi - lo,), value(blk), dtype=dtype) for blk, lo, hi in spans]
        return torch.cat(parts).to(device)  # (B,)

    def rows_of(pick: Callable[[EngineJob], torch.Tensor | None]) -> torch.Tensor | None:
        parts = [(pick(blk.state.job), lo, hi) for blk, lo, hi in spans]
        present = [v[lo:hi].to(device) for v, lo, hi in parts if v is not None]
        # the engine packs only jobs with the same kind of conditioning: all or none
        return torch.cat(present) if len(present) == len(parts) else None

    x = torch.cat([blk.state.x[lo:hi] for blk, lo, hi in spans])  # (B, G)
    t = constant(lambda blk: blk.times()[0], torch.float64)
    s = constant(lambda blk: blk.times()[1], torch.float64)
    temperature = constant(lambda blk: blk.state.job.temperature, torch.float32)
    analytic = constant(lambda blk: blk.state.job.sampler == "analytic", torch.bool)
    fixed = None
    if any(blk.state.job.fixed is not None for blk, _, _ in spans):
        none_fixed = torch.zeros(1, x.shape[1], dtype=torch.bool)
        fixed = rows_of(
            lambda job: none_fixed.expand(job.num_cells, -1) if job.fixed is None else job.fixed
        )
    labels = rows_of(lambda job: job.labels)
    cell_types = rows_of(lambda job: job.cell_types)
    gens = slice_generators(slices)
    start = time.perf_counter()
    out = sampler.step(x, t, s, gens, labels, cell_types, temperature, fixed, analytic)
    seconds = time.perf_counter() - start
    fallbacks = sorted(out.fp32_fallback_rows)
    offset, size = 0, sampler.block_rows or x.shape[0]
    blocks_of: dict[int, set[int]] = {}  # job -> the row blocks its rows were in
    for blk, lo, hi in spans:
        blk.state.x[lo:hi] = out.tokens[offset : offset + hi - lo]
        blk.state.fallbacks += sum(1 for row in fallbacks if offset <= row < offset + hi - lo)
        if out.model_calls:
            mine = blocks_of.setdefault(id(blk.state), set())
            mine.update(range(offset // size, (offset + hi - lo - 1) // size + 1))
        offset += hi - lo
    for blk, _, _ in spans:
        blk.state.forwards += len(blocks_of.pop(id(blk.state), ()))
    return x.shape[0], seconds, out.model_calls


def slice_generators(slices: list[Slice]) -> list[torch.Generator]:
    """The slices' row generators, in row order; one in all when every row shares it."""
    gens = [g for blk, a, b in slices for g in blk.generators[a:b]]
    shared = [blk.state.job.generator for blk, _, _ in slices]
    if shared[0] is not None and all(g is shared[0] for g in shared):
        return [shared[0]]
    return gens
