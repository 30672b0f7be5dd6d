"""How long admitted work will take: the estimates behind cost admission and ``Retry-After``.

A ``Workload`` is a snapshot of an engine's jobs as row counts (``Engine.workload``): for each
job in flight, its rows and the row-steps they have left; for each waiting job, the same for the
rows not yet started; and each job's deadline. ``_play`` runs the engine's sharing forward on
those counts (``sharing.fair_shares`` or ``first_come_shares``, the queue joining when rows and
jobs leave room, as ``sharing.admit`` lets it) from event to event: the shares hold until a job
ends or one joins, so a run of thousands of ticks costs a few steps of arithmetic per job. A
tick costs one forward per started row block at the measured forward time.

A new job ``fits`` when it would end by its deadline and no job already admitted that would end
by its own would then miss it: under fair sharing every job that joins slows the ones running.

It errs long, never short, in two ways: a job's rows are taken to need a forward up to its last
step (an absorbing graph's rows often run out of masks earlier and then move on free), and a job
keeps its rows until it ends (the engine frees them as they finish). So admission may refuse a
request that would just have fitted, but does not admit one that cannot, as far as the measured
forward time holds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sedd.engine.job_state import RowBlock
from sedd.engine.jobs import EngineJob
from sedd.engine.scheduler import fair_shares, first_come_shares, reserve_rows, ticks_until_room


@dataclass(frozen=True)
class Work:
    """One job's remaining work: ``rows`` rows with ``left`` row-steps to go between them, and
    the seconds from now to its deadline (``inf``: none)."""

    rows: int
    left: int
    deadline: float = math.inf

    @classmethod
    def of_blocks(cls, blocks: list[RowBlock], now: float) -> Work:
        """A job in flight: all its rows, each to its last step. Rows with nothing left to
        change move on free, but they hold their room in flight until then: counting them as
        work errs long, leaving them out erred short."""
        left = sum(blk.rows * (blk.state.job.total_steps - blk.step) for blk in blocks)
        return cls(sum(blk.rows for blk in blocks), left, _deadline(blocks[0].state.job, now))

    @classmethod
    def of_queued(cls, job: EngineJob, admitted: int = 0, now: float | None = None) -> Work:
        """A job's rows not yet started (all of them for a new one); ``now`` (monotonic) gives
        its deadline, else it has none here."""
        rows = job.num_cells - admitted
        deadline = math.inf if now is None else _deadline(job, now)
        return cls(rows, rows * job.total_steps, deadline)


def _deadline(job: EngineJob, now: float) -> float:
    return math.inf if job.deadline is None else job.deadline - now


@dataclass(frozen=True)
class Workload:
    """What an engine has admitted and queued, with the limits and timing that pace it."""

    running: tuple[Work, ...]  # in flight, in the order the jobs started
    waiting: tuple[Work, ...]  # queued, in arrival order
    budget: int  # max_rows_per_forward: rows a tick steps, and jobs in flight at most
    max_rows_in_flight: int
    fair: bool
    forward_seconds: float  # one forward of one row block, measured
    block_rows: int  # rows a forward takes

    def tick_seconds(self, rows: int) -> float:
        """A tick that steps ``rows`` rows: a forward per started block."""
        return self.forward_seconds * -(-rows // self.block_rows)

    def room_ticks(self, groups: list[list[RowBlock]]) -> int:
        """Ticks until the jobs in flight (``groups``, as ``sharing.groups_of`` gives them)
        leave room for the head of the queue (``sharing.ticks_until_room``)."""
        limits = (self.budget, self.max_rows_in_flight)
        return ticks_until_room(groups, *limits, fair=self.fair)

    def room_seconds(self, groups: list[list[RowBlock]]) -> float:
        """``room_ticks``, each at the forwards the rows in flight take now (a job that has
        just joined counts at once): what a full queue's ``Retry-After`` says."""
        busy = sum(blk.rows for blocks in groups for blk in blocks if blk.has_work)
        return max(0.05, self.tick_seconds(min(busy, self.budget)) * self.room_ticks(groups))

    def alone_seconds(self, new: Work) -> float:
        """``new`` on an idle engine."""
        return Workload((), (), self.budget, self.max_rows_in_flight, self.fair,
                        self.forward_seconds, self.block_rows).finish_seconds(new)  # fmt: skip

    def finish_seconds(self, new: Work, *, after: float = 0.0) -> float:
        """Seconds from now until ``new``, queued behind everything here ``after`` seconds
        from now, would end."""
        return self._play(new, after)[-1].finish

    def fits(self, new: Work, *, after: float = 0.0) -> bool:
        """Whether ``new``, arriving ``after`` seconds from now, would end by its deadline
        (counted from its arrival) without making a job here that ends by its own without it
        end past it: under fair sharing a job that joins slows those already running."""
        base, joined = self._play(None, after), self._play(new, after)
        if joined[-1].finish > after + new.deadline:
            return False
        return all(j.finish <= j.deadline or b.finish > b.deadline
                   for b, j in zip(base, joined, strict=False))  # fmt: skip

    def wait_before_fit(self, new: Work, *, resolution: float = 0.5) -> float:
        """The shortest wait (to ``resolution`` seconds) after which ``new`` ``fits``; ``inf``
        if it never would (too long alone for its deadline)."""
        if self.alone_seconds(new) > new.deadline:
            return math.inf
        if self.fits(new):
            return 0.0
        lo, hi = 0.0, 1.0
        while not self.fits(new, after=hi):
            lo, hi = hi, 2 * hi
        while hi - lo > resolution:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.fits(new, after=mid) else (mid, hi)
        return hi

    def _play(self, new: Work | None, after: float) -> list[_Job]:
        """Every job here (then ``new``, arriving ``after`` seconds from now), played to its
        end event by event; each ``_Job`` holds its ``finish``."""
        jobs = [_Job(w) for w in (*self.running, *self.waiting)]
        active, queue = jobs[: len(self.running)], deque(jobs[len(self.running) :])
        mine = None if new is None else _Job(new, after)
        if mine is not None:
            jobs.append(mine)
        now = 0.0
        while True:
            if mine is not None and not mine.queued and now >= after:
                queue.append(mine)
                mine.queued = True
            self._admit(active, queue)
            active[:] = [j for j in active if j.left > 0]
            if not active:
                if mine is None or mine.queued:
                    return jobs
                now = after  # nothing runs until ``new`` arrives
                continue
            shares = (fair_shares if self.fair else first_come_shares)(
                [j.rows for j in active], self.budget
            )
            per_tick = self.tick_seconds(sum(shares))
            ticks = min(-(-j.left // s) for j, s in zip(active, shares, strict=True) if s)
            if mine is not None and not mine.queued and now + ticks * per_tick >= after:
                ticks = max(1, math.ceil((after - now) / per_tick))  # ``new`` arrives first
            now += ticks * per_tick
            for j, s in zip(active, shares, strict=True):
                j.advance(s * ticks, now)
            active[:] = [j for j in active if j.left > 0]

    def _admit(self, active: list[_Job], queue: deque[_Job]) -> None:
        """``sharing.admit`` on counts: the queue in order while there is room, then (fair)
        small jobs past the rest, into the reserve."""
        rows = sum(j.rows for j in active)
        while queue and rows < self.max_rows_in_flight and len(active) < self.budget:
            active.append(queue.popleft())
            rows += active[-1].rows
        if not self.fair:
            return
        reserve = reserve_rows(self.max_rows_in_flight)
        for job in [j for j in queue if j.rows <= reserve]:
            if rows + job.rows <= self.max_rows_in_flight + reserve and len(active) < self.budget:
                queue.remove(job)
                active.append(job)
                rows += job.rows


class _Job:
    """A job's remaining work while a ``Workload`` is played forward."""

    def __init__(self, work: Work, arrives: float = 0.0) -> None:
        self.rows, self.left = work.rows, work.left
        self.deadline = arrives + work.deadline  # from now
        self.finish, self.queued = 0.0 if work.left <= 0 else math.inf, False

    def advance(self, steps: int, now: float) -> None:
        """``steps`` more row-steps, ending at ``now``: the rows stay level, so they start to
        finish in their last step (never more rows than row-steps left)."""
        self.left -= steps
        self.rows = min(self.rows, max(self.left, 0))
        if self.left <= 0:
            self.finish = now
