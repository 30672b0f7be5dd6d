"""Several models on one thread (``sedd.engine.group.EngineGroup``): cells as each model alone,
turns between models, admission that sees the other models' ticks, and unloading only when idle."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from engine_models import FP32, LOADED, job, solo

from sedd.checkpoints import LoadedModel
from sedd.engine import Engine, EngineStopped
from sedd.engine.group import EngineBusy, EngineGroup


def _other_model() -> LoadedModel:
    """A second model of the same shape whose weights differ (its cells differ)."""
    model = copy.deepcopy(LOADED.model)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(-1.5)
    return dataclasses.replace(LOADED, model=model, path=LOADED.path.with_name("other"))


OTHER = _other_model()


def _engine(group: EngineGroup, loaded: LoadedModel, **kw: object) -> Engine:
    return Engine.for_model(loaded, FP32, **group.engine_options(), **kw)  # type: ignore[arg-type]


def test_each_models_cells_are_its_cells_alone_when_one_thread_ticks_both() -> None:
    group = EngineGroup()
    a, b = _engine(group, LOADED), _engine(group, OTHER)
    group.add("a", a)
    group.add("b", b)
    group.start()
    try:
        jobs = {"a": [job(3, seed=1), job(2, seed=2)], "b": [job(3, seed=1), job(4, seed=5)]}
        handles = [
            (name, j, eng.submit(j)) for name, eng in (("a", a), ("b", b)) for j in jobs[name]
        ]
        results = {(name, id(j)): h.future.result(timeout=120).tokens for name, j, h in handles}
    finally:
        group.stop()
    for name, j, _ in handles:
        alone = solo(j, LOADED if name == "a" else OTHER)
        assert torch.equal(results[(name, id(j))], alone)
    # the two models' cells differ, so the comparison above tells them apart
    assert not torch.equal(results[("a", id(jobs["a"][0]))], results[("b", id(jobs["b"][0]))])
    assert not (group.running or a.running)


def test_a_burst_on_one_model_leaves_the_other_a_tick_every_round() -> None:
    group = EngineGroup()
    big = _engine(group, LOADED, max_rows_per_forward=2, max_rows_in_flight=2)
    small = _engine(group, OTHER)
    group.add("big", big)
    group.add("small", small)
    ticked: list[str] = []
    for name, eng in (("big", big), ("small", small)):
        original = eng.tick

        def counted(original=original, name=name) -> int:  # type: ignore[no-untyped-def]
            ticked.append(name)
            return original()

        eng.tick = counted  # type: ignore[method-assign]
    burst = [big.submit(job(2, steps=8, seed=s)) for s in range(6)]  # 6 jobs, 2 rows at a time
    quick = small.submit(job(1, steps=3, seed=0))
    group.start()
    try:
        quick.future.result(timeout=120)
        for handle in burst:
            handle.future.result(timeout=120)
    finally:
        group.stop()
    # the small job ticked last where it ended (it had no work after): up to there, its 3 steps
    # (+ its denoise) took turns with the burst, one tick of each a round
    until_quick = ticked[: len(ticked) - ticked[::-1].index("small")]
    assert 3 <= until_quick.count("small") <= 4
    assert until_quick.count("big") <= until_quick.count("small") + 1
    assert ticked.count("big") > 2 * until_quick.count("big")  # the burst went on after


def test_admission_prices_a_tick_with_the_other_models_ticks() -> None:
    group = EngineGroup()
    a = _engine(group, LOADED, forward_cost_s=0.1)
    b = _engine(group, OTHER, forward_cost_s=0.1)
    group.add("a", a)
    group.add("b", b)
    assert a.contention() == 1.0  # nobody else has work
    b.submit(job(2, seed=0))  # queued on b, never ticked: the group is not started
    a.last_busy_tick_s, b.last_busy_tick_s = 0.2, 0.6
    assert a.contention() == pytest.approx(1.0 + 0.6 / 0.2)
    assert b.contention() == 1.0  # a has no work
    workload = a.workload()
    assert workload is not None and workload.forward_seconds == pytest.approx(0.1 * 4.0)
    group.stop(drain=False)


def test_a_model_with_work_is_never_removed_and_a_removed_one_takes_no_job() -> None:
    group = EngineGroup()
    a, b = _engine(group, LOADED), _engine(group, OTHER)
    group.add("a", a)
    group.add("b", b)
    handle = a.submit(job(1, seed=0))
    with pytest.raises(EngineBusy):
        group.remove("a")
    assert "a" in group
    assert group.remove("b") is b and "b" not in group
    with pytest.raises(EngineStopped):
        b.submit(job(1, seed=0))
    group.start()
    handle.future.result(timeout=120)
    group.remove("a")  # idle now
    group.stop()


def test_an_engine_built_without_the_groups_condition_is_refused() -> None:
    group = EngineGroup()
    with pytest.raises(ValueError, match="engine_options"):
        group.add("a", Engine.for_model(LOADED, FP32))
