"""Continuous batching engine: packed steps reproduce solo runs; limits and faults stay isolated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from clocks import ManualClock
from devices import DEVICE
from engine_models import (
    BINS,
    FP32,
    GENES,
    LOADED,
    PERTS,
    engine_job,
    job,
    request_of,
    run_until_idle,
    solo,
)
from torch import nn

from sedd.checkpoints import load_checkpoint
from sedd.defaults import OptionError
from sedd.diffusion.sampling import Proposal, Sampler, StepBranches, StepRows
from sedd.diffusion.st3_samplers import AnalyticSampler, EulerSampler
from sedd.engine import (
    Engine,
    EngineFull,
    EngineJob,
    EngineSettings,
    EngineStopped,
    JobCancelled,
    JobResult,
    JobTimeout,
    ModelLimits,
    StepProgress,
    run_job,
)
from sedd.io.tokens import tokens_to_counts
from sedd.precision import NonFiniteScoreError, PrecisionPolicy
from sedd.request.plan import plan
from sedd.run import run_plan


class Recorder:
    def __init__(self) -> None:
        self.forwards: list[int] = []
        self.calls = 0
        self.done: list[tuple[int, str]] = []

    def on_forward(self, rows: int, seconds: float, calls: int) -> None:
        assert seconds >= 0 and calls >= 1
        self.forwards.append(rows)
        self.calls += calls

    def on_job_done(self, job: EngineJob, result: JobResult | None, outcome: str) -> None:
        self.done.append((job.num_cells, outcome))


def test_forwards_are_the_model_calls_row_blocks_and_skipped_steps_included():
    """A job counts the model calls it ran: one per row block per step, none for a step with
    nothing left to unmask (the denoise after a grid that unmasked every gene)."""
    calls: list[int] = []
    hook = LOADED.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        for rows, steps in ((1, 3), (5, 4), (7, 2)):
            calls.clear()
            rec = Recorder()
            sampler = EulerSampler(
                LOADED.model, LOADED.noise, LOADED.graph, precision=FP32, block_rows=2
            )
            engine = Engine(sampler, ModelLimits(num_genes=GENES, num_perturbations=PERTS),
                            observer=rec)  # fmt: skip
            handle = engine.submit(job(rows, steps=steps, seed=rows))
            run_until_idle(engine)
            result = handle.future.result(timeout=0)
            assert result.forwards == len(calls) == rec.calls, (rows, steps)
            assert len(calls) <= (steps + 1) * -(-rows // 2)  # blocks of 2 rows per step
            assert len(calls) >= steps * -(-rows // 2)
    finally:
        hook.remove()
    # a standalone step that finds nothing masked (one read-back, no pre-check sync) runs its
    # forward, counts it, and leaves every token and row as it was
    x = torch.zeros(3, GENES, dtype=torch.long, device=DEVICE)
    rows = StepRows.of_request(
        x, 0.5, 0.0, labels=torch.ones(3, dtype=torch.long, device=DEVICE),
        cell_types=torch.zeros(3, dtype=torch.long, device=DEVICE),
    )  # fmt: skip
    out = EulerSampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32).step(rows)
    assert out.model_calls == 1 and torch.equal(out.tokens, x)
    assert out.fp32_fallback_rows == () and out.active is not None
    assert out.active.tolist() == [0, 0, 0]


def test_packed_jobs_with_a_late_joiner_match_their_solo_runs_exactly():
    rec = Recorder()
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=64, observer=rec)
    jobs = [
        job(3, steps=6, label=0, seed=1),
        job(4, steps=3, label=2, seed=2, sampler="analytic", temperature=0.6),
        dataclasses.replace(
            job(2, steps=8, label=3, seed=3, temperature=1.7, first_cell=5),
            cell_types=torch.tensor([1, 0]),
        ),
    ]
    late = job(3, steps=5, label=1, seed=4, sampler="analytic")
    calls: list[int] = []
    hook = LOADED.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        handles = [engine.submit(j) for j in jobs]
        engine.tick()
        engine.tick()
        handles.append(engine.submit(late))
        run_until_idle(engine)
    finally:
        hook.remove()
    for j, h in zip([*jobs, late], handles, strict=True):
        result = h.future.result(timeout=0)
        assert torch.equal(result.tokens, solo(j)), j
        assert 1 <= result.forwards <= j.sampling.steps + 1 and result.fp32_fallbacks == 0
        assert int(result.tokens.max()) < BINS
    solo_forwards = sum(j.sampling.steps + 1 for j in [*jobs, late])
    # every packed step is one block here (block_rows 102 >= the rows in flight): one call each
    # 8 steps of the longest job; its denoise found no mask left and ran no forward
    assert len(rec.forwards) == len(calls) == rec.calls == 8 < solo_forwards
    assert rec.forwards[:3] == [9, 9, 12]  # the late job joined at the third boundary
    assert [outcome for _, outcome in rec.done] == ["ok"] * 4


def test_rows_never_exceed_the_cap_and_a_big_job_runs_in_row_chunks():
    rec = Recorder()
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=5, observer=rec)
    big, small = job(12, steps=3, label=1, seed=7), job(2, steps=2, label=2, seed=8)
    hb, hs = engine.submit(big), engine.submit(small)
    run_until_idle(engine)
    # a row takes each step until its genes are all drawn, then leaves (a denoise that would
    # find no mask left runs no forward)
    assert max(rec.forwards) <= 5
    rb, rs = hb.future.result(timeout=0), hs.future.result(timeout=0)
    assert 12 + 2 <= sum(rec.forwards) <= 12 * 4 + 2 * 3
    assert sum(rec.forwards) == rb.row_forwards + rs.row_forwards  # every row counted once
    assert rb.genes_committed == 12 * GENES and rs.genes_committed == 2 * GENES
    assert torch.equal(rb.tokens, solo(big))
    assert torch.equal(rs.tokens, solo(small))


def test_the_head_of_the_queue_is_never_overtaken():
    seen: dict[str, list[StepProgress]] = {"head": [], "small": []}
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=5)
    engine.submit(job(3, steps=2))
    engine.submit(job(4, steps=2), on_progress=seen["head"].append)
    engine.submit(job(1, steps=2), on_progress=seen["small"].append)
    engine.tick()  # 3 + 2 of the head's 4 rows; the small job would fit but must wait
    assert engine.active_rows == 5 and seen["small"] == []
    first = seen["head"][0]
    assert (first.step, first.steps, first.rows) == (0, 3, 2)  # its other rows are still queued
    run_until_idle(engine)
    assert seen["head"][-1].step == 3 and seen["small"][-1].step == 3
    assert seen["small"][-1].fraction_masked == 0.0


def test_cancel_drops_the_rows_at_the_next_step():
    rec = Recorder()
    engine = Engine.for_model(LOADED, FP32, observer=rec)
    keep, gone = job(2, steps=5, seed=1), job(3, steps=5, seed=2)
    hk, hg = engine.submit(keep), engine.submit(gone)
    engine.tick()
    hg.cancel()
    engine.tick()
    assert rec.forwards[:2] == [5, 2]
    with pytest.raises(JobCancelled):
        hg.future.result(timeout=0)
    run_until_idle(engine)
    assert torch.equal(hk.future.result(timeout=0).tokens, solo(keep))
    assert (3, "cancelled") in rec.done and (2, "ok") in rec.done


def test_a_job_is_counted_before_its_caller_sees_the_result():
    """Metrics read right after a response must already include that response's job."""
    handles: dict[int, object] = {}
    seen: list[tuple[str, bool]] = []

    class Watcher(Recorder):
        def on_job_done(self, job: EngineJob, result: JobResult | None, outcome: str) -> None:
            seen.append((outcome, handles[job.num_cells].future.done()))

    engine = Engine.for_model(LOADED, FP32, observer=Watcher())
    handles[2] = engine.submit(job(2, steps=3))
    handles[3] = engine.submit(job(3, steps=3))
    engine.tick()
    handles[3].cancel()
    run_until_idle(engine)
    assert sorted(seen) == [("cancelled", False), ("ok", False)]
    assert handles[2].future.result(timeout=0).tokens.shape == (2, GENES)


def test_deadline_fails_the_job_with_job_timeout():
    rec, clock = Recorder(), ManualClock()
    engine = Engine.for_model(LOADED, FP32, observer=rec, clock=clock)
    late = engine.submit(job(2, steps=50, deadline=clock() + 5.0))
    ok = engine.submit(job(1, steps=3))
    engine.tick()
    clock.advance(4.9)
    engine.tick()
    assert not late.future.done()  # one tick before its deadline: still running
    clock.advance(0.2)
    run_until_idle(engine)
    with pytest.raises(JobTimeout):
        late.future.result(timeout=0)
    assert ok.future.result(timeout=0).tokens.shape == (1, GENES)
    assert (2, "timeout") in rec.done


def test_a_job_cancelled_past_its_deadline_counts_as_a_timeout():
    """The server cancels a job whose deadline passed while the engine was busy: that is a
    timeout (504), not a client that went away."""
    rec, clock = Recorder(), ManualClock()
    engine = Engine.for_model(LOADED, FP32, observer=rec, clock=clock)
    late = engine.submit(job(2, steps=50, deadline=clock() + 5.0))
    gone = engine.submit(job(1, steps=50))
    engine.tick()
    clock.advance(6.0)
    late.cancel()  # what the server does at the deadline
    gone.cancel()  # a client that went away
    run_until_idle(engine)
    assert sorted(rec.done) == [(1, "cancelled"), (2, "timeout")]


def test_full_queue_raises_engine_full_with_retry_after():
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=2, max_queued_jobs=2)
    engine.submit(job(2))
    engine.submit(job(2))
    with pytest.raises(EngineFull) as err:
        engine.submit(job(1))
    assert err.value.retry_after > 0
    engine.tick()  # the first job starts, so one queue place frees up
    assert engine.queued_jobs == 1 and engine.active_jobs == 1
    engine.submit(job(1))
    with pytest.raises(EngineFull) as err:
        engine.submit(job(1))
    assert 0 < err.value.retry_after < 5


def test_stop_with_drain_finishes_in_flight_jobs_then_rejects():
    engine = Engine.for_model(LOADED, FP32)
    a, b = job(2, steps=4, seed=1), job(1, steps=6, seed=2)
    ha, hb = engine.submit(a), engine.submit(b)
    engine.tick()
    engine.stop(drain=True)
    assert torch.equal(ha.future.result(timeout=0).tokens, solo(a))
    assert torch.equal(hb.future.result(timeout=0).tokens, solo(b))
    with pytest.raises(EngineStopped):
        engine.submit(job(1))


def test_stop_without_drain_cancels_everything():
    engine = Engine.for_model(LOADED, FP32)
    handles = [engine.submit(job(2)) for _ in range(2)]
    engine.tick()
    engine.stop(drain=False)
    for h in handles:
        with pytest.raises(JobCancelled):
            h.future.result(timeout=0)


class NanForLabel(nn.Module):
    """Wraps a model; rows with label ``bad`` get NaN (only under autocast if ``amp_only``)."""

    def __init__(self, inner: nn.Module, bad: int, amp_only: bool = False) -> None:
        super().__init__()
        self.inner, self.bad, self.amp_only = inner, bad, amp_only
        self.parametrisation, self.vocab_size, self.mask_index = "x0", BINS + 1, BINS

    def forward(self, x, sigma, labels=None, cell_types=None):
        out = self.inner(x, sigma, labels=labels, cell_types=cell_types)
        if self.amp_only and not torch.is_autocast_enabled(DEVICE.type):
            return out
        return out.masked_fill((labels == self.bad)[:, None, None], float("nan"))


def test_nan_that_fp32_cannot_fix_fails_only_that_job():
    rec = Recorder()
    loaded = dataclasses.replace(LOADED, model=NanForLabel(LOADED.model, bad=2))
    engine = Engine.for_model(loaded, FP32, observer=rec)
    good = job(3, steps=4, label=1, seed=1)
    mixed = dataclasses.replace(job(2, steps=4, seed=2), labels=torch.tensor([0, 2]))
    hg, hb, hm = engine.submit(good), engine.submit(job(2, label=2)), engine.submit(mixed)
    run_until_idle(engine)
    assert torch.equal(hg.future.result(timeout=0).tokens, solo(good))
    for h in (hb, hm):
        with pytest.raises(NonFiniteScoreError):
            h.future.result(timeout=0)
    assert sorted(o for _, o in rec.done) == ["error", "error", "ok"]
    # still serving: the cell's 4 steps draw all its genes, so it leaves without the denoise
    assert engine.submit(job(1)).job_id == 3 and run_until_idle(engine) == 4


def test_fp32_fallbacks_are_counted_on_the_job_whose_rows_needed_them():
    model = NanForLabel(LOADED.model, bad=2, amp_only=True)
    bf16 = PrecisionPolicy(device=DEVICE, amp_dtype=torch.bfloat16)
    engine = Engine.for_model(dataclasses.replace(LOADED, model=model), bf16)
    fixable, clean = engine.submit(job(2, steps=3, label=2)), engine.submit(job(3, steps=3))
    run_until_idle(engine)
    fallbacks = fixable.future.result(timeout=0).fp32_fallbacks
    assert 2 <= fallbacks <= 2 * 4  # 2 rows while they hold masks, at most 4 forwards
    assert clean.future.result(timeout=0).fp32_fallbacks == 0


class OomAbove(nn.Module):
    """Raises CUDA-style out-of-memory when a forward has more than ``rows`` rows."""

    def __init__(self, inner: nn.Module, rows: int) -> None:
        super().__init__()
        self.inner, self.rows, self.ran = inner, rows, []
        self.parametrisation, self.vocab_size, self.mask_index = "x0", BINS + 1, BINS

    def forward(self, x, sigma, labels=None, cell_types=None):
        if x.shape[0] > self.rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.ran.append(x.shape[0])
        return self.inner(x, sigma, labels=labels, cell_types=cell_types)


def test_out_of_memory_splits_the_rows_and_fails_only_a_job_too_big_alone():
    model = OomAbove(LOADED.model, rows=4)
    # forwards as large as the packed rows (no fixed blocks), so halving the rows halves them
    sampler = Sampler(model, LOADED.noise, LOADED.graph, precision=FP32, block_rows=None)
    engine = Engine(sampler, ModelLimits.of_model(LOADED))
    jobs = [job(3, seed=1), job(3, seed=2, label=2), job(2, seed=3, sampler="analytic")]
    handles = [engine.submit(j) for j in jobs]
    too_big = engine.submit(job(5, seed=4))
    run_until_idle(engine)
    for j, h in zip(jobs, handles, strict=True):
        alone = Engine(sampler, ModelLimits.of_model(LOADED))
        assert torch.equal(h.future.result(timeout=0).tokens, run_job(alone, j).tokens)
    with pytest.raises(torch.OutOfMemoryError):
        too_big.future.result(timeout=0)
    assert max(model.ran) <= 4 and 3 in model.ran and 2 in model.ran  # one forward per job


def test_a_step_that_fails_after_drawing_is_retried_with_the_same_draws(monkeypatch):
    """Counter-based streams: a step that ran (and drew) and then failed is simply run again;
    nothing was used up, so every cell equals its solo run."""
    engine = Engine.for_model(LOADED, FP32)
    propose = engine.sampler.propose
    failures: list[int] = []

    def flaky(rows: StepRows, plan: StepBranches, *, amp: bool = True) -> Proposal:
        proposal = propose(rows, plan, amp=amp)  # the draws happen, then it fails
        if rows.num_rows > 3:
            failures.append(rows.num_rows)
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return proposal

    monkeypatch.setattr(engine.sampler, "propose", flaky)
    jobs = [job(2, seed=1), job(2, seed=2, label=3), job(1, seed=3)]
    handles = [engine.submit(j) for j in jobs]
    run_until_idle(engine)
    assert failures[0] == 5 and max(failures) == 5  # the packed step failed, then split
    for j, h in zip(jobs, handles, strict=True):
        assert torch.equal(h.future.result(timeout=0).tokens, solo(j))


def test_background_thread_resolves_futures_and_stops():
    progress: list[StepProgress] = []
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4)
    engine.start()
    assert engine.running
    jobs = [job(3, steps=5, seed=i, label=i % PERTS) for i in range(4)]
    handles = [engine.submit(j, on_progress=progress.append) for j in jobs]
    for j, h in zip(jobs, handles, strict=True):
        assert torch.equal(h.future.result(timeout=20).tokens, solo(j))
    with pytest.raises(RuntimeError, match="only it may call tick"):
        engine.tick()
    assert engine.last_tick_monotonic is not None
    engine.stop(drain=True, timeout=10)
    assert not engine.running and engine.active_rows == 0
    assert max(p.step for p in progress) == 6
    with pytest.raises(EngineStopped):
        engine.submit(job(1))


def test_imputation_keeps_given_tokens_and_matches_a_solo_run():
    engine = Engine.for_model(LOADED, FP32)
    x_init = torch.full((2, GENES), BINS)
    x_init[:, :4] = torch.tensor([[0, 1, 2, 3], [4, 4, 0, 1]])
    fixed = x_init != BINS
    imp = dataclasses.replace(job(2, steps=4, seed=5), x_init=x_init, fixed=fixed)
    hi, hp = engine.submit(imp), engine.submit(job(3, steps=6))
    run_until_idle(engine)
    tokens = hi.future.result(timeout=0).tokens
    assert torch.equal(tokens[:, :4], x_init[:, :4]) and torch.equal(tokens, solo(imp))
    assert hp.future.result(timeout=0).tokens.shape == (3, GENES)


def test_one_job_for_a_whole_request_matches_generate_in_batches():
    request = request_of(
        cells_per_condition=2, conditions=("A", "C"), cell_type="NK", steps=4, seed=9,
        sampler="analytic", temperature=0.8,
    )  # fmt: skip
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=3)
    handle = engine.submit(plan(LOADED, request).job())
    run_until_idle(engine)
    counts = tokens_to_counts(handle.future.result(timeout=0).tokens, BINS)
    expected = run_plan(plan(LOADED, request), FP32, settings=EngineSettings(batch_size=3)).counts
    assert (counts == expected).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_cells": 0}, "`num_cells` must be >= 1, got 0"),
        ({"labels": None}, "`labels` must be given"),
        ({"labels": torch.tensor([0, 4])}, r"`labels` must be indices in \[0, 4\)"),
        ({"cell_types": torch.tensor([0, 2])}, r"`cell_types` must be indices in \[0, 2\)"),
        ({"fixed": torch.ones(2, GENES, dtype=torch.bool)}, "`x_init` must be given"),
        ({"x_init": torch.zeros(2, 3, dtype=torch.long)}, r"`x_init` must be .*\(2, 10\)"),
    ],
)
def test_bad_jobs_are_refused_naming_the_field_and_value(change, message):
    engine = Engine.for_model(LOADED, FP32)
    with pytest.raises(ValueError, match=message):
        engine.submit(dataclasses.replace(job(2), **change))
    assert engine.queued_jobs == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "`steps` must be >= 1, got 0"),
        ({"temperature": float("nan")}, "`temperature` must be finite and > 0, got nan"),
        ({"sampler": "ddpm"}, "`sampler` must be one of euler, analytic, entropy, got 'ddpm'"),
        ({"seed": -1}, r"`seed` must be in \[0, 2\*\*63 - 1\], got -1"),
    ],
)
def test_bad_sampling_options_are_refused_before_any_job_exists(change, message):
    """The options check themselves when made, so no job carries a bad one to the engine."""
    with pytest.raises(OptionError, match=message) as err:
        dataclasses.replace(job(2).sampling, **change)
    assert err.value.field == next(iter(change))


def test_uniform_graph_score_model_jobs_match_their_solo_runs():
    # The reference SEDD uniform-graph fixture: random starting tokens from each cell's seed.
    ref = Path(__file__).resolve().parents[1] / "data" / "sedd_reference" / "uniform" / "hf"
    with pytest.warns(UserWarning, match="GENES ARE POSITIONAL"):
        loaded = load_checkpoint(ref)
    engine = Engine.for_model(loaded, FP32)
    jobs = [
        engine_job(num_cells=2, steps=3, seed=5),
        engine_job(num_cells=3, steps=2, sampler="analytic", seed=9, first_cell=4),
    ]
    handles = [engine.submit(j) for j in jobs]
    run_until_idle(engine)
    for j, handle in zip(jobs, handles, strict=True):
        options = j.sampling
        cls = AnalyticSampler if options.sampler == "analytic" else EulerSampler
        sampler = cls(loaded.model, loaded.noise, loaded.graph, precision=FP32)
        want = sampler.sample(
            j.num_cells,
            steps=options.steps,
            num_genes=64,
            seed=options.seed,
            first_cell=j.first_cell,
        )
        assert torch.equal(handle.future.result().tokens, want)


def test_a_job_is_handed_back_only_after_the_tick_that_finished_it_is_timed():
    """Whoever a job's result wakes (the server's warm-up, restarting the engine's averages
    between its cold and its warm job) finds the tick that finished it already timed: that
    tick writes none of its times after the result is out."""
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=4)
    handle = engine.submit(job(2, steps=3))
    seen: list[tuple[float | None, ...]] = []

    def times(_: object) -> None:  # runs on the ticking thread, as the result is set
        seen.append((engine.tick_started_monotonic, engine.last_tick_monotonic,
                     engine.forward_seconds))  # fmt: skip

    handle.future.add_done_callback(times)
    while not handle.future.done():
        engine.tick()
    [(started, ended, forward)] = seen
    assert started is not None and ended is not None and ended >= started
    assert (ended, forward) == (engine.last_tick_monotonic, engine.forward_seconds)
