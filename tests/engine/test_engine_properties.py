"""Randomised engine runs (hypothesis): random arrivals of jobs (cells, steps, sampler,
temperature, labels, imputation), cancellations, deadlines, and Retry-After estimates between
any ticks, under fair and first-come sharing and small row budgets.

After each run: every submitted job is resolved exactly once, with its outcome counted once; no
row is ever in two blocks; every finished job's cells equal its solo run; and the estimates
change nothing (the run without them has the identical history).

``SEDD_PROPERTY_EXAMPLES`` sets the number of runs (default 30, about 4 s here; CI's
longer step runs more). Time is a fake clock that moves one second a tick, so deadlines fall at
chosen ticks and a run is deterministic.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import torch
from clocks import ManualClock
from engine_models import BINS, FP32, GENES, LOADED, PERTS, job, solo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sedd.defaults import PREDICTORS
from sedd.engine import Engine, EngineFull, EngineJob, JobCancelled, JobTimeout

EXAMPLES = int(os.environ.get("SEDD_PROPERTY_EXAMPLES", "30"))
MAX_TICKS = 400  # a run whose jobs are not all resolved by then has lost one


@dataclass(frozen=True)
class Arrival:
    cells: int
    steps: int
    sampler: str
    temperature: float
    label: int
    seed: int
    impute: bool
    deadline_in: int | None  # ticks from its arrival; None: no deadline


@dataclass(frozen=True)
class Tick:
    arrivals: tuple[Arrival, ...]
    cancel: tuple[int, ...]  # indices into the jobs submitted so far (modulo their number)
    estimate: bool  # ask for Retry-After's estimate before the tick


@dataclass(frozen=True)
class Scenario:
    fair: bool
    rows_per_forward: int
    rows_in_flight: int
    queued: int
    ticks: tuple[Tick, ...]


arrivals = st.builds(
    Arrival,
    cells=st.integers(1, 6),
    steps=st.integers(1, 6),
    sampler=st.sampled_from(PREDICTORS),  # every kind of reverse step
    temperature=st.sampled_from([1.0, 1.0, 0.7]),
    label=st.integers(0, PERTS - 1),
    seed=st.integers(0, 3),
    impute=st.booleans(),
    deadline_in=st.one_of(st.none(), st.none(), st.integers(0, 12)),
)
ticks = st.builds(
    Tick,
    arrivals=st.lists(arrivals, max_size=3).map(tuple),
    cancel=st.lists(st.integers(0, 20), max_size=1).map(tuple),
    estimate=st.booleans(),
)
scenarios = st.builds(
    Scenario,
    fair=st.booleans(),
    rows_per_forward=st.integers(1, 8),
    rows_in_flight=st.integers(1, 16),
    queued=st.integers(1, 4),
    ticks=st.lists(ticks, min_size=1, max_size=10).map(tuple),
)


@dataclass
class Record:
    """What a run did, compared between runs with and without estimates."""

    rows_per_tick: list[int] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)  # job number -> outcome
    tokens: dict[int, torch.Tensor] = field(default_factory=dict)
    counted: dict[int, int] = field(default_factory=dict)  # on_job_done calls per job
    jobs: dict[int, EngineJob] = field(default_factory=dict)


class Counter:
    """The engine's observer: counts each job's on_job_done, as the server's metrics do."""

    def __init__(self, record: Record, numbers: dict[int, int]) -> None:
        self.record, self.numbers = record, numbers

    def on_job_done(self, job_: EngineJob, result: object, outcome: str) -> None:
        n = self.numbers[id(job_)]
        self.record.counted[n] = self.record.counted.get(n, 0) + 1


def _engine_job(a: Arrival, clock: ManualClock) -> EngineJob:
    kw: dict[str, object] = {"sampler": a.sampler, "temperature": a.temperature, "seed": a.seed}
    if a.deadline_in is not None:
        kw["deadline"] = clock.now + a.deadline_in + 0.5
    if a.impute:
        g = torch.Generator().manual_seed(a.seed * 31 + a.cells)
        fixed = torch.rand(a.cells, GENES, generator=g) < 0.4
        values = torch.randint(0, BINS, (a.cells, GENES), generator=g)
        kw["x_init"] = torch.where(fixed, values, BINS)
        kw["fixed"] = fixed
    return job(a.cells, steps=a.steps, label=a.label, **kw)


def _assert_rows_disjoint(engine: Engine) -> None:
    """No row of a job is in two in-flight blocks, and none lies outside its admitted rows."""
    by_job: dict[int, list[tuple[int, int]]] = {}
    for blk in engine._queue.active:
        assert 0 <= blk.lo < blk.hi <= blk.state.admitted, (blk.lo, blk.hi, blk.state.admitted)
        by_job.setdefault(id(blk.state), []).append((blk.lo, blk.hi))
    for spans in by_job.values():
        spans.sort()
        for (_, hi), (lo, _) in itertools.pairwise(spans):
            assert hi <= lo, f"rows in two blocks: {spans}"


def run(scenario: Scenario, *, estimates: bool) -> Record:
    record, numbers, handles = Record(), {}, []
    clock = ManualClock(start=0.0)  # one second a tick
    engine = Engine.for_model(
        LOADED, FP32, max_rows_per_forward=scenario.rows_per_forward,
        max_rows_in_flight=scenario.rows_in_flight, max_queued_jobs=scenario.queued,
        fair=scenario.fair, observer=Counter(record, numbers), clock=clock,
    )  # fmt: skip
    for tick in scenario.ticks:
        for a in tick.arrivals:
            ej = _engine_job(a, clock)
            try:
                handle = engine.submit(ej)
            except EngineFull as full:
                assert full.retry_after > 0
                continue
            numbers[id(ej)] = len(handles)
            record.jobs[len(handles)] = ej
            handles.append(handle)
        for i in tick.cancel:
            if handles:
                handles[i % len(handles)].cancel()
        if estimates and tick.estimate:
            assert engine.ticks_until_room() >= 1
            _assert_rows_disjoint(engine)
        record.rows_per_tick.append(engine.tick())
        _assert_rows_disjoint(engine)
        clock.advance(1.0)
    while not all(h.future.done() for h in handles):
        assert len(record.rows_per_tick) < MAX_TICKS, "a job was never resolved"
        if estimates:
            engine.ticks_until_room()
        record.rows_per_tick.append(engine.tick())
        _assert_rows_disjoint(engine)
        clock.advance(1.0)
    assert engine.active_jobs == 0 and engine.queued_jobs == 0
    for n, handle in enumerate(handles):
        err = handle.future.exception(timeout=0)
        if err is None:
            record.outcomes[n] = "ok"
            record.tokens[n] = handle.future.result(timeout=0).tokens
        else:
            kinds = {JobCancelled: "cancelled", JobTimeout: "timeout"}
            kind = (k for t, k in kinds.items() if isinstance(err, t))
            record.outcomes[n] = next(kind, repr(err))
    return record


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="SEDD_PROPERTY_EXAMPLES" not in os.environ,  # CI's longer step explores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios)
def test_random_engine_runs_resolve_every_job_once_with_its_solo_cells(scenario):
    with_estimates = run(scenario, estimates=True)
    # every submitted job resolved exactly once, and counted once
    assert set(with_estimates.outcomes) == set(with_estimates.jobs)
    assert with_estimates.counted == dict.fromkeys(with_estimates.jobs, 1)
    assert set(with_estimates.outcomes.values()) <= {"ok", "cancelled", "timeout"}
    for n, tokens in with_estimates.tokens.items():
        assert torch.equal(tokens, solo(with_estimates.jobs[n])), n
    # the estimates are pure: the same run without them has the identical history
    without = run(scenario, estimates=False)
    assert without.rows_per_tick == with_estimates.rows_per_tick
    assert without.outcomes == with_estimates.outcomes
    assert without.tokens.keys() == with_estimates.tokens.keys()
    for n, tokens in without.tokens.items():
        assert torch.equal(tokens, with_estimates.tokens[n])
