"""How long admitted work will take: the estimates behind cost admission and ``Retry-After``.

A ``Workload`` is a snapshot of an engine's jobs as row counts (``Engine.workload``): for each
job in flight, the rows that still need a forward and the row-steps they have left; for each
waiting job, the same for the rows not yet started. ``finish_seconds`` plays the engine's
sharing forward on those counts (``sharing.fair_shares`` or ``first_come_shares``, the queue
joining when rows and jobs leave room, as ``sharing.admit`` lets it) from event to event: the
shares hold until a job ends or one joins, so a run of thousands of ticks costs a few steps of
arithmetic per job. A tick costs one forward per started row block at the measured forward time.

It errs long, never short, in two ways: a job's rows are taken to need a forward up to its last
step (an absorbing graph's rows often run out of masks earlier and then move on free), and a job
keeps its rows until it ends (the engine frees them as they finish). So admission may refuse a
request that would just have fitted, but does not admit one that cannot.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sedd.engine.jobs import EngineJob
from sedd.engine.rows import RowBlock
from sedd.engine.sharing import fair_shares, first_come_shares, ticks_until_room


@dataclass(frozen=True)
class Work:
    """One job's remaining work: ``rows`` rows with ``left`` row-steps to go between them."""

    rows: int
    left: int

    @classmethod
    def of_blocks(cls, blocks: list[RowBlock]) -> Work:
        """A job in flight: all its rows, each to its last step. Rows with nothing left to
        change move on free, but they hold their room in flight until then: counting them as
        work errs long, leaving them out erred short."""
        left = sum(blk.rows * (blk.state.job.total_steps - blk.step) for blk in blocks)
        return cls(sum(blk.rows for blk in blocks), left)

    @classmethod
    def of_queued(cls, job: EngineJob, admitted: int = 0) -> Work:
        """A job's rows not yet started (all of them for a new one)."""
        rows = job.num_cells - admitted
        return cls(rows, rows * job.total_steps)


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

    def finish_seconds(self, new: Work, *, after: float = 0.0, limit: float = math.inf) -> float:
        """Seconds from now until ``new``, queued behind everything here ``after`` seconds
        from now, would end; ``inf`` once that is past ``limit``."""
        active = [_Job(w) for w in self.running]
        queue, mine = deque(_Job(w) for w in self.waiting), _Job(new)
        now, pending = 0.0, after > 0
        if not pending:
            queue.append(mine)
        while True:
            self._admit(active, queue)
            if not pending and mine.left <= 0:
                return now
            if now > limit:
                return math.inf
            if not active:  # nothing runs until ``new`` arrives
                now, pending = after, False
                queue.append(mine)
                continue
            shares = (fair_shares if self.fair else first_come_shares)(
                [j.rows for j in active], self.budget
            )
            per_tick = self.tick_seconds(sum(shares))
            ticks = min(-(-j.left // s) for j, s in zip(active, shares, strict=True) if s)
            if pending and now + ticks * per_tick >= after:  # ``new`` arrives first
                ticks, pending = max(1, math.ceil((after - now) / per_tick)), False
                queue.append(mine)
            now += ticks * per_tick
            for j, s in zip(active, shares, strict=True):
                j.advance(s * ticks)
            active[:] = [j for j in active if j.left > 0]

    def wait_before_fit(self, new: Work, deadline: float, *, resolution: float = 0.5) -> float:
        """The shortest wait (to ``resolution`` seconds) after which ``new`` would end within
        ``deadline`` seconds of its arrival; ``inf`` if it never would (too big alone)."""
        if self.alone_seconds(new) > deadline:
            return math.inf
        if self.finish_seconds(new, limit=deadline) <= deadline:
            return 0.0
        lo, hi = 0.0, 1.0
        while self.finish_seconds(new, after=hi, limit=hi + deadline) > hi + deadline:
            lo, hi = hi, 2 * hi
        while hi - lo > resolution:
            mid = (lo + hi) / 2
            fits = self.finish_seconds(new, after=mid, limit=mid + deadline) <= mid + deadline
            lo, hi = (lo, mid) if fits else (mid, hi)
        return hi

    def _admit(self, active: list[_Job], queue: deque[_Job]) -> None:
        rows = sum(j.rows for j in active)
        while queue and rows < self.max_rows_in_flight and len(active) < self.budget:
            active.append(queue.popleft())
            rows += active[-1].rows


class _Job:
    """A job's remaining work while a ``Workload`` is played forward."""

    def __init__(self, work: Work) -> None:
        self.rows, self.left = work.rows, work.left

    def advance(self, steps: int) -> None:
        """``steps`` more row-steps: the rows stay level, so they start to finish in their last
        step (never more rows than row-steps left)."""
        self.left -= steps
        self.rows = min(self.rows, max(self.left, 0))
