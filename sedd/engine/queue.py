"""The engine's jobs, waiting and in flight, behind one lock: the state ``Engine`` steps.

``JobQueue`` holds the FIFO of accepted jobs (``JobState``: the head may be partly admitted) and
the row blocks in flight (``RowBlock``), whether new jobs are taken, and the ids handed out.
Any thread submits, cancels and reads the counts; the engine thread admits waiting rows, picks
each tick's rows (``sedd.engine.scheduler``) and retires rows that are done. Every method takes
the lock itself; ``wake`` is the condition the engine thread sleeps on while idle.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from sedd.diffusion.reference import StepProgress
from sedd.engine.admission import Work
from sedd.engine.job_state import JobState, RowBlock
from sedd.engine.jobs import (
    EngineFull,
    EngineJob,
    EngineStopped,
    JobCancelled,
    JobHandle,
    JobTimeout,
)
from sedd.engine.scheduler import admit, groups_of, select


class JobQueue:
    """Accepted jobs: ``waiting`` (FIFO, rows not yet admitted) and ``active`` (row blocks)."""

    def __init__(
        self,
        max_queued_jobs: int,
        clock: Callable[[], float] = time.monotonic,
        wake: threading.Condition | None = None,
    ) -> None:
        """``wake``: a condition shared with other queues (``sedd.engine.group``: one thread
        sleeps until any of them has work); its lock is then this queue's lock too."""
        self.max_queued_jobs, self.clock = max_queued_jobs, clock
        self.wake = wake if wake is not None else threading.Condition(threading.Lock())
        self.lock = self.wake
        self.waiting: deque[JobState] = deque()  # the head may be partly admitted
        self.active: list[RowBlock] = []
        self.accepting, self.abort = True, False
        self._next_id = 0

    def put(
        self,
        job: EngineJob,
        on_progress: Callable[[StepProgress], None] | None,
        retry_after: Callable[[], float],
    ) -> JobHandle:
        """Accept ``job`` at the back of the queue; ``EngineStopped`` once draining,
        ``EngineFull`` (with ``retry_after()``'s wait, taken outside the lock) when full."""
        with self.lock:
            if not self.accepting:
                raise EngineStopped("the engine is shutting down and takes no new jobs.")
            queued = sum(1 for st in self.waiting if st.admitted == 0)
            if queued < self.max_queued_jobs:
                handle = JobHandle(self._next_id, self.notify)
                self._next_id += 1
                self.waiting.append(JobState(job, handle, on_progress, self.clock()))
                self.wake.notify_all()
                return handle
        message = f"the queue is full ({queued} jobs waiting); try again later."
        raise EngineFull(message, retry_after())

    def notify(self) -> None:
        with self.lock:
            self.wake.notify_all()

    def take_ended(self, now: float) -> list[tuple[JobState, Exception]]:
        """Jobs past their deadline or cancelled, removed, each with the error it ends with."""
        with self.lock:
            ended: list[tuple[JobState, Exception]] = []
            for st in self._states():
                name = f"job {st.handle.job_id}"
                # past its deadline it timed out, even when the caller has cancelled it for that
                if st.job.deadline is not None and now > st.job.deadline:
                    ended.append((st, JobTimeout(f"{name} did not finish before its deadline.")))
                elif st.handle.cancel_requested or st.handle.future.cancelled():
                    ended.append((st, JobCancelled(f"{name} was cancelled.")))
            for st, _ in ended:
                self._remove(st)
            return ended

    def admit(
        self, budget: int, max_rows_in_flight: int, now: float, *, fair: bool
    ) -> list[RowBlock]:
        """Waiting rows that join now (``scheduler.admit``), added to those in flight."""
        with self.lock:
            joined = admit(self.waiting, self.active, budget, max_rows_in_flight, now, fair=fair)
            self.active.extend(joined)
            return joined

    def select(self, budget: int, *, fair: bool) -> list[RowBlock]:
        """This tick's blocks (``scheduler.select``); blocks split by the shares stay in flight."""
        with self.lock:
            chosen, self.active = select(groups_of(self.active), budget, fair=fair)
        return [blk for blk in chosen if not blk.state.done]

    def retire(self, blocks: list[RowBlock]) -> tuple[dict[int, int], list[RowBlock]]:
        """Drop the rows of ``blocks`` that are done: a block past its last step, or (absorbing
        graph) rows with every gene drawn, which leave at once so their room goes to waiting
        work. Returns the rows finished per job (by ``id`` of its state) and the blocks still
        in flight."""
        finished: dict[int, int] = {}
        with self.lock:
            for blk in blocks:
                if blk.state.done or blk not in self.active:
                    continue
                kept = [] if blk.finished else blk.working()
                if kept != [blk]:
                    at = self.active.index(blk)
                    self.active[at : at + 1] = kept
                    gone = blk.rows - sum(part.rows for part in kept)
                    blk.state.rows_done += gone
                    finished[id(blk.state)] = finished.get(id(blk.state), 0) + gone
            return finished, list(self.active)

    def remove(self, st: JobState) -> None:
        with self.lock:
            self._remove(st)

    def _remove(self, st: JobState) -> None:
        self.active = [blk for blk in self.active if blk.state is not st]
        if st in self.waiting:
            self.waiting.remove(st)

    def states(self) -> list[JobState]:
        """Every job in flight or waiting, each once."""
        with self.lock:
            return self._states()

    def _states(self) -> list[JobState]:
        found = [*(blk.state for blk in self.active), *self.waiting]
        return list({id(st): st for st in found}.values())

    def idle(self) -> bool:
        """No job waiting and none in flight (the caller holds ``lock``)."""
        return not (self.waiting or self.active)

    def snapshot(
        self, now: float
    ) -> tuple[tuple[Work, ...], tuple[Work, ...], list[list[RowBlock]]]:
        """(in flight, waiting) as row counts for admission's estimates, and the blocks in
        flight by job, all at one moment."""
        with self.lock:
            groups = groups_of(self.active)
            running = tuple(Work.of_blocks(blocks, now) for blocks in groups)
            waiting = tuple(Work.of_queued(st.job, st.admitted, now) for st in self.waiting)
        return running, waiting, groups

    def groups(self) -> list[list[RowBlock]]:
        with self.lock:
            return groups_of(self.active)

    @property
    def queued_jobs(self) -> int:
        with self.lock:
            return sum(1 for st in self.waiting if st.admitted == 0)

    @property
    def queued_rows(self) -> int:  # submitted, not yet admitted
        with self.lock:
            return sum(st.job.num_cells - st.admitted for st in self.waiting)

    @property
    def active_jobs(self) -> int:
        with self.lock:
            return len({id(blk.state) for blk in self.active})

    @property
    def active_rows(self) -> int:
        with self.lock:
            return sum(blk.rows for blk in self.active)
