"""How long admitted work will take: the estimates behind cost admission and ``Retry-After``.

A ``Workload`` is a snapshot of an engine's jobs as row counts (``Engine.workload``): for each
job in flight, its rows and the row-steps they have left; for each waiting job, the same for the
rows not yet started; and each job's deadline. ``Workload._run`` plays the engine's sharing
forward on those counts (``sharing.fair_shares`` or ``first_come_shares``, the queue joining
when rows and jobs leave room, as ``sharing.admit`` lets it) from event to event: the shares hold
until a job ends or one joins, so a run of thousands of ticks costs a few steps of arithmetic per
job. A tick costs one forward per started row block at the measured forward time.

An admission check (``wait_before_fit``: ``fits`` at each wait its search tries) plays the work
already admitted once (``_Check``); each try resumes from the event in which the new job would
arrive and stops once its verdict is settled, instead of replaying every job with and without it
(about 40 plays for a refused request: 0.3-0.7 s on the event loop at 150-256 jobs in flight).

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
from bisect import bisect_left
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
        play = self._start(new)
        self._run(play, after)
        return play.finish[-1]

    def fits(self, new: Work, *, after: float = 0.0) -> bool:
        """Whether ``new``, arriving ``after`` seconds from now, would end by its deadline
        (counted from its arrival) without making a job here that ends by its own without it
        end past it: under fair sharing a job that joins slows those already running."""
        return _Check(self, new).fits(after)

    def wait_before_fit(self, new: Work, *, resolution: float = 0.5) -> float:
        """The shortest wait (to ``resolution`` seconds) after which ``new`` ``fits``; ``inf``
        if it never would (too long alone for its deadline). The work here is played once
        for the whole search (``_Check``)."""
        if self.alone_seconds(new) > new.deadline:
            return math.inf
        check = _Check(self, new)
        if check.fits(0.0):
            return 0.0
        lo, hi = 0.0, 1.0
        while not check.fits(hi):
            lo, hi = hi, 2 * hi
        while hi - lo > resolution:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if check.fits(mid) else (mid, hi)
        return hi

    def _start(self, new: Work | None) -> _Play:
        """Every job here (then ``new``, last) before the first event."""
        works = (*self.running, *self.waiting, *(() if new is None else (new,)))
        return _Play(
            rows=[w.rows for w in works],
            left=[w.left for w in works],
            finish=[0.0 if w.left <= 0 else math.inf for w in works],
            active=list(range(len(self.running))),
            queue=deque(range(len(self.running), len(self.running) + len(self.waiting))),
            mine=None if new is None else len(works) - 1,
        )

    def _run(self, play: _Play, after: float, watch: _Watch | None = None,
             events: list[_Event] | None = None) -> bool:  # fmt: skip
        """``play`` forward event by event (``new``, if any, joining the queue ``after``
        seconds from now) until every job has ended, or until ``watch`` settles; each job's
        ``finish`` is kept in ``play``. ``events`` (a play without ``new``) gets the state at
        the start of every event, for plays with ``new`` to resume from (``_Check``).
        Returns ``watch``'s verdict (True without one)."""
        rows, left, finish, active, queue = (
            play.rows,
            play.left,
            play.finish,
            play.active,
            play.queue,
        )
        shares_of = fair_shares if self.fair else first_come_shares
        now, mine = play.now, play.mine
        while True:
            if mine is not None and now >= after:
                queue.append(mine)
                mine = None
            if events is not None:
                events.append(_Event(now, math.inf, play.copy(now)))
            self._admit(rows, active, queue)
            active[:] = [j for j in active if left[j] > 0]
            while queue and not active:  # jobs with nothing left took the places: next ones
                self._admit(rows, active, queue)
                active[:] = [j for j in active if left[j] > 0]
            if not active:
                if mine is None:  # a job that never ran (never ended) is past its deadline
                    return watch is None or not watch.deadlines
                now = after  # nothing runs until ``new`` arrives
                continue
            shares = shares_of([rows[j] for j in active], self.budget)
            per_tick = self.tick_seconds(sum(shares))
            ticks = min(-(-left[j] // s) for j, s in zip(active, shares, strict=True) if s)
            if mine is not None and now + ticks * per_tick >= after:
                ticks = max(1, math.ceil((after - now) / per_tick))  # ``new`` arrives first
            now += ticks * per_tick
            if events is not None:
                events[-1].end = now
            ended = []
            for j, s in zip(active, shares, strict=True):
                lj = left[j] = left[j] - s * ticks
                if rows[j] > lj:  # the rows stay level: they finish in their last step
                    rows[j] = max(lj, 0)
                if lj <= 0:
                    finish[j] = now
                    ended.append(j)
            if watch is not None and (verdict := watch.settled(ended, now)) is not None:
                return verdict
            active[:] = [j for j in active if left[j] > 0]

    def _admit(self, rows: list[int], active: list[int], queue: deque[int]) -> None:
        """``sharing.admit`` on counts: the queue in order while there is room, then (fair)
        small jobs past the rest, into the reserve."""
        busy = sum(rows[j] for j in active)
        while queue and busy < self.max_rows_in_flight and len(active) < self.budget:
            active.append(queue.popleft())
            busy += rows[active[-1]]
        if not self.fair:
            return
        reserve = reserve_rows(self.max_rows_in_flight)
        for job in [j for j in queue if rows[j] <= reserve]:
            if busy + rows[job] <= self.max_rows_in_flight + reserve and len(active) < self.budget:
                queue.remove(job)
                active.append(job)
                busy += rows[job]


@dataclass
class _Play:
    """Every job's counts while a ``Workload`` is played forward, by index (``new`` last):
    rows, row-steps left and the time it ends (``inf`` until it does); the jobs in flight, in
    the order they started, and the queue; ``mine``: ``new`` while it has not yet arrived."""

    rows: list[int]
    left: list[int]
    finish: list[float]
    active: list[int]
    queue: deque[int]
    mine: int | None
    now: float = 0.0

    def copy(self, now: float) -> _Play:
        return _Play(self.rows[:], self.left[:], self.finish[:], self.active[:],
                     deque(self.queue), self.mine, now)  # fmt: skip


@dataclass
class _Event:
    """An event of the play without ``new``: its time, the time of the next one, and the
    state at its start."""

    now: float
    end: float
    play: _Play


class _Check:
    """``Workload.fits`` for one new job at any arrival time, the work here played once.

    Until ``new`` arrives the play with it is the play without it, event for event, so the
    play with it resumes from the state at the start of the event in which it arrives (where
    the two first differ) and stops as soon as the verdict is settled: when ``new`` and every
    job that ends by its deadline without it have ended, or one of them is past its deadline."""

    def __init__(self, load: Workload, new: Work) -> None:
        self.load, self.new = load, new
        base = load._start(None)
        self.events: list[_Event] = []
        load._run(base, math.inf, events=self.events)
        self.ends = [event.end for event in self.events]  # non-decreasing
        self.deadlines = [w.deadline for w in (*load.running, *load.waiting)]
        # the jobs a new one could make late: they end by their deadline without it
        self.on_time = [j for j, d in enumerate(self.deadlines)
                        if base.finish[j] <= d < math.inf]  # fmt: skip

    def fits(self, after: float) -> bool:
        k = 0 if after <= 0.0 else bisect_left(self.ends, after)
        event = self.events[min(k, len(self.events) - 1)]
        play = event.play.copy(event.now)
        new, mine = self.new, len(self.deadlines)
        play.rows.append(new.rows)
        play.left.append(new.left)
        play.finish.append(0.0 if new.left <= 0 else math.inf)
        play.mine = mine
        deadlines = {j: self.deadlines[j] for j in self.on_time if play.left[j] > 0}
        if new.left <= 0:  # it ends at once
            if after + new.deadline < 0.0:
                return False
        elif after + new.deadline < math.inf:
            deadlines[mine] = after + new.deadline
        return self.load._run(play, after, _Watch(deadlines))


class _Watch:
    """The jobs whose end settles a check, with their deadlines: settled False when one ends
    past its deadline or is still running past it, True when all have ended in time."""

    def __init__(self, deadlines: dict[int, float]) -> None:
        self.deadlines = deadlines
        self.order = sorted(deadlines, key=deadlines.__getitem__, reverse=True)

    def settled(self, ended: list[int], now: float) -> bool | None:
        deadlines = self.deadlines
        for j in ended:
            if j in deadlines and now > deadlines.pop(j):
                return False
        if not deadlines:
            return True
        order = self.order
        while order[-1] not in deadlines:
            order.pop()
        return False if now > deadlines[order[-1]] else None
