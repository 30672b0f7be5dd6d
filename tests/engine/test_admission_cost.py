"""Admission's cost (issue 44, item 9): one check plays the work admitted once, not once per
step of the ``Retry-After`` search, and says what the replay it replaced said.

``_reference`` below is that replay, kept as it was: every job played from now for each
arrival time tried, with and without the new job (about 40 plays a refused request)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque

import pytest

from sedd.engine import admission
from sedd.engine.admission import Work, Workload
from sedd.engine.scheduler import fair_shares, first_come_shares, reserve_rows


class _Job:
    def __init__(self, work: Work, arrives: float = 0.0) -> None:
        self.rows, self.left = work.rows, work.left
        self.deadline = arrives + work.deadline
        self.finish, self.queued = 0.0 if work.left <= 0 else math.inf, False

    def advance(self, steps: int, now: float) -> None:
        self.left -= steps
        self.rows = min(self.rows, max(self.left, 0))
        if self.left <= 0:
            self.finish = now


def _admit(load: Workload, active: list[_Job], queue: deque[_Job]) -> None:
    rows = sum(j.rows for j in active)
    while queue and rows < load.max_rows_in_flight and len(active) < load.budget:
        active.append(queue.popleft())
        rows += active[-1].rows
    if not load.fair:
        return
    reserve = reserve_rows(load.max_rows_in_flight)
    for job in [j for j in queue if j.rows <= reserve]:
        if rows + job.rows <= load.max_rows_in_flight + reserve and len(active) < load.budget:
            queue.remove(job)
            active.append(job)
            rows += job.rows


def _play(load: Workload, new: Work | None, after: float) -> list[_Job]:
    jobs = [_Job(w) for w in (*load.running, *load.waiting)]
    active, queue = jobs[: len(load.running)], deque(jobs[len(load.running) :])
    mine = None if new is None else _Job(new, after)
    if mine is not None:
        jobs.append(mine)
    now = 0.0
    while True:
        if mine is not None and not mine.queued and now >= after:
            queue.append(mine)
            mine.queued = True
        _admit(load, active, queue)
        active[:] = [j for j in active if j.left > 0]
        if not active:
            if mine is None or mine.queued:
                return jobs
            now = after
            continue
        shares = (fair_shares if load.fair else first_come_shares)(
            [j.rows for j in active], load.budget
        )
        per_tick = load.tick_seconds(sum(shares))
        ticks = min(-(-j.left // s) for j, s in zip(active, shares, strict=True) if s)
        if mine is not None and not mine.queued and now + ticks * per_tick >= after:
            ticks = max(1, math.ceil((after - now) / per_tick))
        now += ticks * per_tick
        for j, s in zip(active, shares, strict=True):
            j.advance(s * ticks, now)
        active[:] = [j for j in active if j.left > 0]


def _fits(load: Workload, new: Work, after: float) -> bool:
    base, joined = _play(load, None, after), _play(load, new, after)
    if joined[-1].finish > after + new.deadline:
        return False
    return all(j.finish <= j.deadline or b.finish > b.deadline
               for b, j in zip(base, joined, strict=False))  # fmt: skip


def _wait_before_fit(load: Workload, new: Work, resolution: float = 0.5) -> float:
    idle = dataclasses.replace(load, running=(), waiting=())
    if _play(idle, new, 0.0)[-1].finish > new.deadline:
        return math.inf
    if _fits(load, new, 0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while not _fits(load, new, hi):
        lo, hi = hi, 2 * hi
    while hi - lo > resolution:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _fits(load, new, mid) else (mid, hi)
    return hi


def _random_load(rng: random.Random, running: int, waiting: int, **limits: object) -> Workload:
    """Jobs of a few rows, some with rows past their row-steps (rows on their last step), and
    deadlines from none to just after their end without a new job (so a new one rarely fits
    at once and ``wait_before_fit`` searches)."""

    def work(last_steps: bool = False) -> Work:
        rows = rng.randint(1, 8)
        if last_steps and rng.random() < 0.3:
            return Work(rows, rng.randint(0, rows))
        return Work(rows, rows * rng.randint(1, 40))

    budget = limits.get("budget", rng.randint(1, 12))
    load = Workload(  # queued work is never done, and one job in flight has steps to go
        tuple(work(last_steps=i > 0) for i in range(running)),
        tuple(work() for _ in range(waiting)),
        budget,
        limits.get("max_rows_in_flight", rng.randint(budget, 5 * budget)),
        limits.get("fair", rng.random() < 0.7),
        limits.get("forward_seconds", rng.choice([1.0, 0.1, rng.uniform(0.01, 2.0)])),
        limits.get("block_rows", rng.randint(1, 2 * budget)),
    )
    ends = [job.finish for job in _play(load, None, 0.0)]

    def deadline(end: float) -> float:
        return rng.choice([math.inf, end + rng.uniform(0.0, 5.0), end * rng.uniform(0.5, 3.0),
                           rng.uniform(-1.0, 2 * end + 1.0)])  # fmt: skip

    dated = [dataclasses.replace(w, deadline=deadline(e))
             for w, e in zip((*load.running, *load.waiting), ends, strict=True)]  # fmt: skip
    return dataclasses.replace(load, running=tuple(dated[:running]),
                               waiting=tuple(dated[running:]))  # fmt: skip


def _random_new(rng: random.Random, load: Workload) -> Work:
    rows = rng.randint(1, 10)
    new = Work(rows, rows * rng.randint(1, 40))
    alone = load.alone_seconds(new)
    due = rng.choice([math.inf, alone * rng.uniform(0.8, 4.0), alone + rng.uniform(0.0, 50.0)])
    return dataclasses.replace(new, deadline=due)


@pytest.mark.parametrize("seed", range(40))
def test_one_play_a_check_says_what_the_replay_said(seed):
    """Random workloads (fair and first-come, queues, the reserve, rows on their last step,
    deadlines missed anyway): every estimate equals the replay's, to the last bit."""
    rng = random.Random(seed)
    for _ in range(25):
        load = _random_load(rng, rng.randint(0, 14), rng.randint(0, 10))
        new = _random_new(rng, load)
        assert load.wait_before_fit(new) == _wait_before_fit(load, new)
        end = _play(load, None, 0.0)
        horizon = max((j.finish for j in end), default=0.0)
        for after in (0.0, rng.uniform(0.0, horizon), rng.uniform(0.0, 2 * horizon + 2)):
            assert load.fits(new, after=after) == _fits(load, new, after)
            assert load.finish_seconds(new, after=after) == _play(load, new, after)[-1].finish


def _busy(running: int, waiting: int) -> tuple[Workload, Work]:
    """The server's limits (256 rows a forward, 1,024 in flight, blocks of 64) with ``running``
    jobs in flight (their rows filling the 1,024, or the 256 jobs) and ``waiting`` queued, each
    due a few seconds after it would end: a new job does not fit until most have ended, so its
    ``Retry-After`` is searched for."""
    rng = random.Random(running)
    most = 1024 // running + 4

    def work() -> Work:
        rows = rng.randint(most - 6, most) if most > 6 else rng.randint(1, most)
        return Work(rows, rows * rng.randint(10, 100))

    load = Workload(tuple(work() for _ in range(running)), tuple(work() for _ in range(waiting)),
                    256, 1024, True, 0.05 * 1.75, 64)  # fmt: skip
    ends = [job.finish for job in _play(load, None, 0.0)]
    dated = [dataclasses.replace(w, deadline=end + rng.uniform(0.5, 5.0))
             for w, end in zip((*load.running, *load.waiting), ends, strict=True)]  # fmt: skip
    load = dataclasses.replace(load, running=tuple(dated[:running]),
                               waiting=tuple(dated[running:]))  # fmt: skip
    return load, Work(8, 8 * 100, deadline=60.0)


class _Shares:
    """Counts the job-steps played: each event splits a tick's rows between the jobs in
    flight (``fair_shares``) and moves each of them on, so its cost is the jobs in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.job_steps = 0
        monkeypatch.setattr(admission, "fair_shares", self.count(fair_shares))

    def count(self, shares):
        def counted(demands: list[int], budget: int) -> list[int]:
            self.job_steps += len(demands)
            return shares(demands, budget)

        return counted


@pytest.mark.parametrize(("running", "waiting"), [(150, 64), (256, 64)])
def test_an_admission_check_plays_the_work_about_once(monkeypatch, running, waiting):
    """Issue 44 item 9: with 150 jobs running and 64 queued one check took 551 ms on the
    event loop: the ``Retry-After`` search played every job twice for each of its ~20 tries.
    Now a check plays them once, and a try only what follows the new job's arrival, up to
    the deadlines it settles: a few plays' job-steps, where the replay took about forty."""
    load, new = _busy(running, waiting)
    counter = _Shares(monkeypatch)
    load.finish_seconds(new)  # one play of every job
    one_play = counter.job_steps
    counter.job_steps = 0
    wait = load.wait_before_fit(new)
    assert wait > 8  # refused: the search ran
    assert counter.job_steps <= 12 * one_play, (counter.job_steps, one_play)


def test_work_queued_behind_jobs_with_nothing_left_is_played():
    """Jobs in flight with no row-steps left (rows on their last step) held the places a tick
    has for jobs (``budget``) when the queue was let in, then left: the play ended with the
    queue still waiting, as if it never ran, so every new job came out never ending and
    ``wait_before_fit`` doubled its wait for ever, on the event loop. Now the next jobs start."""
    load = Workload((Work(3, 0),), (Work(2, 20),), 1, 4, True, 1.0, 4)
    new = Work(1, 5, deadline=100.0)
    assert load.finish_seconds(new) == 20 + 5  # a row a tick: the queued job's 20, then 5
    assert load.fits(new) and load.wait_before_fit(new) == 0.0
