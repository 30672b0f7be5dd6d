"""One step of every in-flight block: proposed on the device, read back once, settled.

The engine (``sedd.engine.core``) decides which rows are in flight; ``Stepper.step`` moves them
one step. Blocks are grouped by kind of conditioning (index vs vector labels, with vs without
cell types), one packed step a kind (``sedd.engine.job_state``). Every kind is proposed first, with
no host sync; then one small tensor comes back for all of them (``Stepper.readbacks`` counts
these reads); then each is settled: rows whose output was not finite are recomputed in fp32 and
the new tokens are written into their jobs.

Faults stay with their job: a failed proposal or settlement is split in halves (out of memory)
or retried job by job (anything else), and a job that still fails alone gets the error. The
randomness is counter-based, so a retry draws the very numbers the failed step drew.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from sedd.diffusion.sampling import Proposal, Sampler
from sedd.engine.forwards import step_bytes
from sedd.engine.job_state import (
    JobState,
    Packed,
    RowBlock,
    Slice,
    halves,
    propose_slices,
    settle_packed,
)
from sedd.engine.jobs import BlockOutOfMemoryError, JobResult, is_out_of_memory

log = logging.getLogger(__name__)

Finish = Callable[[JobState, JobResult | None, Exception | None], None]


class Stepper:
    """Steps blocks of rows on ``sampler``; ``finish`` fails a job, ``observe`` reports."""

    def __init__(self, sampler: Sampler, finish: Finish, observe: Callable[..., None]) -> None:
        self.sampler, self._finish, self._observe = sampler, finish, observe
        self.readbacks = 0  # device -> host reads of step results (one a tick, as a rule)
        self.model_calls = 0  # model forwards run so far (row blocks, fp32 recomputation)

    def step(self, blocks: list[RowBlock]) -> None:
        """One step of every block: one packed step per kind of conditioning, proposed on the
        device, then the tick's one readback, then each settled. A block with nothing left to
        change (known from the last readback) runs no forward and only moves on a step."""
        kinds: dict[tuple[object, ...], list[Slice]] = {}
        for blk in blocks:
            if not blk.has_work:
                continue
            labels, cell_types = blk.state.job.labels, blk.state.job.cell_types
            kind = (None if labels is None else labels.dim(), cell_types is None)
            kinds.setdefault(kind, []).append((blk, 0, blk.rows))
        pending = [packed for slices in kinds.values() for packed in self._attempt(slices)]
        if pending:
            # the tick's one host sync: a (rows, 2) tensor of non-finite flags and counts
            summary = self._read_back([p.proposal for p in pending])
            offset = 0
            for packed in pending:
                rows = packed.rows.num_rows
                self._settle(packed, summary[offset : offset + rows])
                offset += rows
        for blk in blocks:
            if not blk.state.done:
                blk.step += 1

    def _read_back(self, proposals: list[Proposal]) -> np.ndarray:
        """(rows, 2) [non-finite, still active] of ``proposals``, on the host: a sync on CUDA."""
        self.readbacks += 1
        return torch.cat([p.summary() for p in proposals]).cpu().numpy()

    def _attempt(self, slices: list[Slice]) -> list[Packed]:
        """Propose ``slices`` as one packed step; on failure split (OOM) or isolate the jobs.

        Randomness is counter-based, so a retried step draws the very numbers it would have:
        there is no generator state to save or restore.
        """
        slices = [sl for sl in slices if not sl[0].state.done]
        if not slices:
            return []
        try:
            return [propose_slices(self.sampler, slices)]
        except Exception as err:  # a job's fault must never stop the engine
            return self._recover(slices, err)

    def _recover(self, slices: list[Slice], err: Exception) -> list[Packed]:
        jobs = list({id(blk.state): blk.state for blk, _, _ in slices}.values())
        if len(jobs) == 1:
            log.warning("job %d failed: %r", jobs[0].handle.job_id, err)
            self._finish(jobs[0], None, self._explained(err, slices[0][0].state.x.shape[-1]))
            return []
        if is_out_of_memory(err):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return [packed for half in halves(slices) for packed in self._attempt(half)]
        alone = ([sl for sl in slices if sl[0].state is st] for st in jobs)
        return [packed for part in alone for packed in self._attempt(part)]

    def _explained(self, err: Exception, genes: int) -> Exception:
        """An out-of-memory error that says which setting lowers a forward's memory: every
        forward runs on whole blocks, so fewer cells do not help, a smaller block does."""
        if not is_out_of_memory(err) or isinstance(err, BlockOutOfMemoryError):
            return err
        rows = self.sampler.block_rows
        if rows is None:
            return err
        suggested = max(genes, rows * genes // 2)
        return BlockOutOfMemoryError(
            f"out of device memory in a block step of {rows} rows x {genes} genes x "
            f"{self.sampler.graph.dim} tokens (about "
            f"{step_bytes(rows, genes, self.sampler.graph.dim) / 2**30:.1f} GiB): lower "
            f"--tokens-per-forward (SEDD_TOKENS_PER_FORWARD, now {rows * genes}), e.g. to "
            f"{suggested} ({err})",
            tokens_per_forward=rows * genes,
            suggested=suggested,
        )

    def _settle(self, packed: Packed, summary: np.ndarray) -> None:
        """Write a proposed step back into its jobs; a failure (fp32 too not finite, out of
        memory in the recomputation) is retried as ``_attempt`` does, read back at once."""
        try:
            rows, seconds, calls = settle_packed(self.sampler, packed, summary)
        except Exception as err:
            for retry in self._recover(packed.slices, err):
                self._settle(retry, self._read_back([retry.proposal]))
            return
        if calls:
            self.model_calls += calls
            self._observe("on_forward", rows, seconds, calls)
