"""Admission's estimates (``sedd.engine.admission``) against what the engine then really does:
when a new job ends behind the work already admitted, and how long a full queue waits."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from engine_models import FP32, LOADED, engine_job, job

from sedd.checkpoints import LoadedModel, load_checkpoint
from sedd.engine import Engine, EngineFull
from sedd.engine.admission import Work, Workload
from sedd.engine.scheduler import reserve_rows


@pytest.fixture(scope="module")
def uniform_model() -> LoadedModel:
    """Every position of a row can change to the end: rows need a forward up to their last
    step, as the estimate assumes, so it should be close; an absorbing graph errs long."""
    ref = Path(__file__).resolve().parents[1] / "data" / "sedd_reference" / "uniform" / "hf"
    with pytest.warns(UserWarning, match="GENES ARE POSITIONAL"):
        return load_checkpoint(ref)


class Forwards:
    """Observer: the model forwards run so far (the estimate's unit, at 1 s a forward)."""

    calls = 0

    def on_forward(self, rows: int, seconds: float, calls: int) -> None:
        self.calls += calls


def _engine(loaded: LoadedModel, **kw: object) -> tuple[Engine, Forwards]:
    seen = Forwards()
    # priced at 1 s a forward (the estimate's unit), whatever this machine's forwards take
    engine = Engine.for_model(loaded, FP32, observer=seen, fair=True, forward_cost_s=1.0, **kw)
    engine.sampler.block_rows = 2  # several forwards a tick, so the tick's cost is priced too
    return engine, seen


@pytest.mark.parametrize(
    ("running", "new", "budget", "in_flight"),
    [
        ([(4, 10), (2, 3)], (1, 5), 4, 8),  # the new job starts at once and shares the rows
        ([(4, 10), (4, 6)], (2, 4), 4, 8),  # no room: it waits until a job ends
        ([(3, 12)], (6, 2), 3, 12),  # more rows than a tick steps: it gets a share
        ([(2, 5), (2, 5), (2, 5)], (1, 3), 2, 6),  # more jobs than rows a tick
        ([(4, 10), (4, 6), (4, 5)], (1, 4), 4, 8),  # small: past the queued job, the reserve
    ],
)
def test_finish_estimate_matches_the_engine_and_never_errs_short(
    uniform_model, running, new, budget, in_flight
):
    engine, seen = _engine(uniform_model, max_rows_per_forward=budget,
                           max_rows_in_flight=in_flight)  # fmt: skip
    for i, (cells, steps) in enumerate(running):
        engine.submit(engine_job(cells, steps=steps, seed=i))
    engine.tick()
    workload = engine.workload()
    new_job = engine_job(new[0], steps=new[1], seed=9)
    predicted = workload.finish_seconds(Work.of_queued(new_job))
    start = seen.calls
    handle = engine.submit(new_job)
    while not handle.future.done():
        engine.tick()
    actual = seen.calls - start
    assert actual <= predicted <= 1.3 * actual + 2, (predicted, actual)


def test_estimates_err_long_when_rows_run_out_of_masks():
    engine, seen = _engine(LOADED, max_rows_per_forward=4, max_rows_in_flight=8)
    engine.submit(job(4, steps=12, seed=1))
    engine.tick()
    new_job = job(2, steps=6, seed=2)
    predicted = engine.workload().finish_seconds(Work.of_queued(new_job))
    start = seen.calls
    handle = engine.submit(new_job)
    while not handle.future.done():
        engine.tick()
    assert seen.calls - start <= predicted


def test_wait_before_fit_is_the_shortest_wait_that_fits():
    # four jobs of 256 rows x 76 row-steps hold all 1,024 rows in flight; a tick is 1 s
    load = Workload((Work(256, 256 * 76),) * 4, (), 256, 1024, True, 1.0, 256)
    big = Work(200, 200 * 11, deadline=20.0)  # more rows than the reserve: it waits for room
    assert load.alone_seconds(big) == 11
    assert load.finish_seconds(big) == 4 * 76 + 11  # the four share the ticks, then its 11
    wait = load.wait_before_fit(big)
    assert load.fits(big, after=wait) and not load.fits(big, after=wait - 1.0)
    assert load.finish_seconds(big, after=wait) - wait <= 20.0
    assert load.wait_before_fit(Work(200, 200 * 11, deadline=400.0)) == 0.0
    assert math.isinf(load.wait_before_fit(Work(1, 30, deadline=20.0)))  # 30 ticks alone


def test_a_small_job_joins_past_maximal_ones_into_the_reserve():
    """Behind four maximal jobs a 1-cell job is not queued for their whole run: it joins the
    reserve at once and its share of each tick ends it in its own steps."""
    assert reserve_rows(1024) == 128 and reserve_rows(6) == 1
    load = Workload((Work(256, 256 * 76),) * 4, (Work(256, 256 * 76),), 256, 1024, True, 1.0, 256)
    small = Work(1, 11, deadline=20.0)
    assert load.finish_seconds(small) == 11 and load.wait_before_fit(small) == 0.0
    first_come = Workload(load.running, load.waiting, 256, 1024, False, 1.0, 256)
    assert first_come.finish_seconds(small) > 4 * 76  # no reserve without fair sharing


def test_a_job_that_would_push_an_admitted_one_past_its_deadline_does_not_fit():
    """Under fair sharing a job that joins takes rows from the ones running: it is refused if
    an admitted job that would end in time alone would then end late (it is not enough that
    the new one itself ends in time)."""
    running = Work(4, 4 * 10, deadline=10.5)  # 10 ticks at 4 rows a tick: just in time
    load = Workload((running,), (), 4, 8, True, 1.0, 4)
    joiner = Work(2, 2 * 3, deadline=100.0)  # would end in time itself, sharing 2 + 2
    assert load.finish_seconds(joiner) <= 100.0
    assert not load.fits(joiner)
    assert load.fits(Work(2, 6, deadline=100.0), after=load.wait_before_fit(joiner))
    late = Workload((Work(4, 40, deadline=5.0),), (), 4, 8, True, 1.0, 4)  # late anyway
    assert late.fits(joiner)  # a job that misses its deadline regardless does not block


def test_retry_after_prices_a_job_that_just_joined_at_once():
    """A full queue's Retry-After is its ticks at the forwards the rows in flight take now: a
    big job that has just joined makes each tick dearer at once (a moving average of past ticks
    lagged, and Retry-After came out at a third of the wait)."""
    engine, seen = _engine(LOADED, max_rows_per_forward=8, max_rows_in_flight=8,
                           max_queued_jobs=1)  # fmt: skip
    engine.submit(job(8, steps=10, seed=1))
    engine.tick()  # 8 rows in flight: 4 forwards of 2 rows a tick
    engine.submit(job(2, steps=2, seed=2))  # the queue's one place (more than the reserve)
    with pytest.raises(EngineFull) as full:
        engine.submit(job(1, steps=2, seed=3))
    start, queued = seen.calls, engine.queued_jobs
    while engine.queued_jobs == queued:
        engine.tick()
    waited = seen.calls - start  # forwards until the queued job started
    # it errs long only by the ticks of rows that finish before their last step (all their
    # genes drawn: they leave, which the estimate does not foresee): here up to 2 of 10
    assert waited <= full.value.retry_after <= waited + 3 * 4, (full.value.retry_after, waited)


def test_a_few_slow_ticks_do_not_move_the_forward_time_admission_prices_with():
    """Ticks slowed by other work in the process (the event loop parsing a large body took the
    GIL: a 24 ms forward read as 283 ms, and requests that would finish were refused) move the
    median forward time little; a lasting change moves it within a few ticks."""
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4)
    slow = {"on": False}
    hook = LOADED.model.register_forward_pre_hook(
        lambda *_: time.sleep(0.3) if slow["on"] else None
    )
    try:
        engine.submit(job(4, steps=30, seed=1))
        for _ in range(9):
            engine.tick()
        fast = engine.forward_seconds
        slow["on"] = True
        for _ in range(2):
            engine.tick()
        assert engine.forward_seconds < fast + 0.05 < 0.3, (fast, engine.forward_seconds)
        for _ in range(5):
            engine.tick()
        assert engine.forward_seconds >= 0.3  # most of the last ticks were slow: it moved
    finally:
        hook.remove()


def test_a_fixed_forward_cost_prices_admission_whatever_the_forwards_take():
    """``forward_cost_s`` fixes the forward time admission and Retry-After price with: ticks
    slowed by other work, and the warm-up's restart, leave it where it was set."""
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4, forward_cost_s=0.25)
    assert engine.forward_seconds == 0.25 and engine.workload().forward_seconds == 0.25
    hook = LOADED.model.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    try:
        engine.submit(job(4, steps=6, seed=1))
        for _ in range(4):
            engine.tick()
    finally:
        hook.remove()
    engine.restart_timing()
    assert engine.forward_seconds == 0.25
    new = Work.of_queued(job(1, steps=3, seed=2))
    # one row: one forward (one block) for each of its row-steps, each priced at 0.25 s
    assert new.left == 4 and engine.workload().alone_seconds(new) == 0.25 * 4
    with pytest.raises(ValueError, match="forward_cost_s"):
        Engine.for_model(LOADED, FP32, forward_cost_s=0.0)
