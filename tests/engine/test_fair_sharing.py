"""Fair row sharing (the server's engine): a small job runs beside a big one, cells unchanged,
and the queue's wait is estimated from the shares the jobs in flight really get."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch
from engine_models import FP32, LOADED, engine_job, job, run_until_idle, solo

from sedd.checkpoints import LoadedModel, load_checkpoint
from sedd.engine import Engine, EngineFull
from sedd.engine.scheduler import fair_shares, first_come_shares


@pytest.fixture(scope="module")
def uniform_model() -> LoadedModel:
    """The reference SEDD uniform-graph fixture: every position of a row can change to the end."""
    ref = Path(__file__).resolve().parents[1] / "data" / "sedd_reference" / "uniform" / "hf"
    with pytest.warns(UserWarning, match="GENES ARE POSITIONAL"):
        return load_checkpoint(ref)


@pytest.mark.parametrize(
    ("wants", "budget", "shares"),
    [
        ([256, 1], 256, [255, 1]),
        ([10, 10], 5, [3, 2]),  # a remainder goes to the earlier job
        ([1, 1, 1], 2, [1, 1, 0]),  # more jobs than rows: the earliest get one each
        ([0, 5, 2], 6, [0, 4, 2]),  # what a small job leaves goes to the others
        ([3, 4], 100, [3, 4]),
    ],
)
def test_fair_shares_split_a_step_max_min_fairly(wants, budget, shares):
    assert fair_shares(wants, budget) == shares


def test_fair_shares_hold_their_invariants_on_random_demands():
    rng = random.Random(5)
    for _ in range(500):
        wants = [rng.randrange(0, 40) for _ in range(rng.randrange(1, 9))]
        budget = rng.randrange(1, 120)
        shares = fair_shares(wants, budget)
        assert sum(shares) == min(budget, sum(wants))
        assert all(0 <= s <= w for s, w in zip(shares, wants, strict=True))
        # max-min: a job that got less than it wanted has at most one row less than any other
        for s, w in zip(shares, wants, strict=True):
            if s < w:
                assert max(shares) <= s + 1, (wants, budget, shares)
    assert first_come_shares([3, 4, 5], 6) == [3, 3, 0]


def _ticks_until_done(engine: Engine, handle) -> int:
    ticks = 0
    while not handle.future.done():
        engine.tick()
        ticks += 1
        assert ticks < 200
    return ticks


@pytest.mark.parametrize("fair", [True, False])
def test_a_small_job_runs_beside_a_big_one_only_when_fair(fair):
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4, max_rows_in_flight=8, fair=fair)
    big, small = job(4, steps=30, seed=3), job(1, steps=3, label=2, seed=4)
    hb = engine.submit(big)
    engine.tick()
    engine.tick()
    hs = engine.submit(small)
    waited = _ticks_until_done(engine, hs)
    if fair:  # shares [3, 1]: its 3 steps and the denoise, one a tick
        assert waited <= 4
    else:  # the big job holds every row of each step until its rows start to finish
        assert waited >= 25
    run_until_idle(engine)
    # rows stepped in a staircase (the big job's split between ticks) give the solo cells
    assert torch.equal(hb.future.result(timeout=0).tokens, solo(big))
    assert torch.equal(hs.future.result(timeout=0).tokens, solo(small))


def test_fair_engine_keeps_a_big_jobs_rows_level_and_each_step_full():
    steps_seen: list[int] = []
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=5, max_rows_in_flight=20,
                              fair=True)  # fmt: skip
    a, b = job(6, steps=8, seed=1), job(6, steps=8, seed=2)
    updates = []
    ha = engine.submit(a, on_progress=lambda p: (steps_seen.append(p.step), updates.append(p)))
    hb = engine.submit(b)
    rows = []
    while not (ha.future.done() and hb.future.done()):
        rows.append(engine.tick())
    # 5 rows a tick, shared 3 + 2 then 2 + 3: each job's rows stay within a step of each other
    assert max(rows) <= 5 + 6 * 2  # rows with nothing left to change move on free
    assert steps_seen == sorted(steps_seen) and steps_seen[-1] == 9
    # a step at a time, until the last rows' genes are all drawn: they leave, and the job is
    # done (its denoise, step 9, would have found no mask)
    assert all(b - a <= 1 for a, b in itertools.pairwise(steps_seen[:-1]))
    assert sum(p.finished for p in updates) == 6 and updates[-1].fraction_unmasked == 1.0
    assert [p.fraction_unmasked for p in updates] == sorted(p.fraction_unmasked for p in updates)
    assert torch.equal(ha.future.result(timeout=0).tokens, solo(a))
    assert torch.equal(hb.future.result(timeout=0).tokens, solo(b))


@pytest.mark.parametrize(
    ("first", "second"),
    [((4, 10), (2, 3)), ((3, 2), (3, 9)), ((5, 6), (1, 12)), ((2, 7), (4, 7))],
)
def test_ticks_until_room_is_the_wait_the_queue_really_has(uniform_model, first, second):
    """The estimate behind Retry-After, against the ticks after which the head of the queue
    really can start. On a uniform graph every row has work to its last step, so the estimate
    is exact; an absorbing graph's rows can run out of masks early, and then it errs long."""
    engine = Engine.for_model(uniform_model, FP32, max_rows_per_forward=4, max_rows_in_flight=6,
                              max_queued_jobs=2, fair=True)  # fmt: skip
    engine.submit(engine_job(first[0], steps=first[1], seed=1))
    engine.submit(engine_job(second[0], steps=second[1], seed=2))
    engine.tick()  # both start: 6 rows in flight, the cap
    # the queue's two places, with more rows than the reserve for small jobs (one row here)
    engine.submit(engine_job(2, steps=2, seed=3))
    engine.submit(engine_job(2, steps=2, seed=4))
    with pytest.raises(EngineFull) as err:
        engine.submit(engine_job(1, steps=2, seed=5))
    predicted = engine.ticks_until_room()
    assert err.value.retry_after > 0
    waited = 0
    while engine.active_rows >= engine.max_rows_in_flight:
        engine.tick()
        waited += 1
    assert waited == predicted > 1, (first, second)


def test_ticks_until_room_errs_long_when_rows_run_out_of_masks():
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4, max_rows_in_flight=6,
                              fair=True)  # fmt: skip
    engine.submit(job(3, steps=2, seed=1))
    engine.submit(job(3, steps=9, seed=2, label=3))
    engine.tick()
    predicted = engine.ticks_until_room()
    waited = 0
    while engine.active_rows >= engine.max_rows_in_flight:
        engine.tick()
        waited += 1
    assert 1 <= waited <= predicted <= 4


@pytest.mark.parametrize("fair", [True, False])
def test_retry_after_estimates_between_ticks_leave_running_jobs_intact(fair):
    """The estimate behind Retry-After once joined a split job's blocks in place: the engine was
    left with overlapping blocks, and a job split by the shares never finished."""
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=3, max_rows_in_flight=9,
                              fair=fair)  # fmt: skip
    big, small = job(8, steps=20, seed=1), job(1, steps=20, seed=2, label=2)
    hb, hs = engine.submit(big), engine.submit(small)
    ticks = 0
    while not (hb.future.done() and hs.future.done()):
        assert engine.ticks_until_room() >= 1
        engine.tick()
        ticks += 1
        assert ticks < 200, "a job was never resolved"
    assert torch.equal(hb.future.result(timeout=0).tokens, solo(big))
    assert torch.equal(hs.future.result(timeout=0).tokens, solo(small))
