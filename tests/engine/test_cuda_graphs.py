"""CUDA graphs for the fixed-shape block steps: a replayed cell equals the eager cell bit for bit,
a step makes no host sync on CUDA, and a capture that fails falls back to eager with one warning.

The ``needs_cuda`` tests run in the CUDA lane (``SEDD_TEST_DEVICE=cuda pytest``); the rest pin
the switches and the fallback on any device.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from devices import DEVICE, needs_cuda
from engine_models import LOADED, job, run_until_idle

from sedd.diffusion.cuda_graphs import GraphedSteps, cuda_graphs_from_env
from sedd.diffusion.sampling import Sampler, StepBranches, StepRows
from sedd.engine import Engine, EngineJob, ModelLimits
from sedd.precision import PrecisionPolicy, resolve_precision

FP32 = PrecisionPolicy(device=DEVICE, amp_dtype=None)


def run_jobs(sampler: Sampler, jobs: list[EngineJob]) -> list[torch.Tensor]:
    engine = Engine(sampler, ModelLimits.of_model(LOADED), max_rows_per_forward=16)
    handles = [engine.submit(j) for j in jobs]
    run_until_idle(engine)
    return [h.future.result(timeout=0).tokens for h in handles]


def mixed_jobs() -> list[EngineJob]:
    return [
        job(5, steps=6, seed=1),
        job(3, steps=4, seed=2, label=2, sampler="analytic"),
        job(2, steps=5, seed=3, label=3, temperature=0.6),
    ]


def sampler(graphs: bool, policy: PrecisionPolicy = FP32) -> Sampler:
    return Sampler(
        LOADED.model, LOADED.noise, LOADED.graph,
        precision=policy, block_rows=4, cuda_graphs=graphs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, False), ("1", True), ("true", True), ("on", True), ("0", False), ("no", False)],
)
def test_sedd_cuda_graphs_switch(monkeypatch: pytest.MonkeyPatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("SEDD_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("SEDD_CUDA_GRAPHS", raw)
    assert cuda_graphs_from_env() is expected


def test_a_bad_sedd_cuda_graphs_value_names_the_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SEDD_CUDA_GRAPHS", "maybe")
    with pytest.raises(ValueError, match=r"`SEDD_CUDA_GRAPHS` must be .*got 'maybe'"):
        cuda_graphs_from_env()


def test_graphs_are_eager_off_cuda():
    calls: list[int] = []

    def step(rows: StepRows, plan: StepBranches, amp: bool):
        calls.append(rows.num_rows)
        return rows.x, rows.t > 0, rows.step

    graphed = GraphedSteps(step, enabled=True, device=torch.device("cpu"))
    rows = StepRows.of_request(torch.zeros(3, 4, dtype=torch.long), 0.5, 0.25)
    assert not graphed.enabled
    graphed.run(rows, StepBranches(), True)
    assert calls == [3] and graphed.captures == 0 and graphed.replays == 0


def test_a_failed_capture_warns_once_and_stays_eager(monkeypatch: pytest.MonkeyPatch):
    graphed = sampler(True)
    graphed.graphs.enabled = True  # as on CUDA, whatever the device here

    def broken(*_: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphed.graphs, "_capture", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = run_jobs(graphed, mixed_jobs())
    graph_warnings = [w for w in caught if "CUDA graph capture failed" in str(w.message)]
    assert len(graph_warnings) == 1 and not graphed.graphs.enabled
    for got, want in zip(tokens, run_jobs(sampler(False), mixed_jobs()), strict=True):
        assert torch.equal(got, want)


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_replayed_cells_equal_eager_cells_bit_for_bit(precision: str):
    policy = resolve_precision(precision, DEVICE)
    graphed, eager = sampler(True, policy), sampler(False, policy)
    got = run_jobs(graphed, mixed_jobs())
    assert graphed.graphs.captures >= 1 and graphed.graphs.replays > graphed.graphs.captures
    for a, b in zip(got, run_jobs(eager, mixed_jobs()), strict=True):
        assert torch.equal(a, b)


@needs_cuda
def test_a_proposed_step_never_syncs_with_the_host():
    mask = LOADED.graph.dim - 1
    x = torch.full((6, LOADED.config.num_genes), mask, device=DEVICE)
    rows = StepRows.of_request(
        x, 0.8, 0.6, seed=4, labels=torch.ones(6, dtype=torch.long, device=DEVICE),
        cell_types=torch.zeros(6, dtype=torch.long, device=DEVICE), temperature=0.7,
    )  # fmt: skip
    plan = StepBranches(any_final=False, kinds=frozenset({"euler"}), any_tempered=True)
    for graphs in (False, True):
        step = sampler(graphs)
        step.propose(rows, plan)  # warm-up (and capture) outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            proposal = step.propose(rows, plan)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert proposal.tokens.shape == x.shape


@needs_cuda
def test_the_engine_on_cuda_with_graphs_matches_solo_runs():
    from engine_models import solo

    jobs = mixed_jobs()
    engine = Engine.for_model(LOADED, FP32, cuda_graphs=True, max_rows_per_forward=16)
    handles = [engine.submit(j) for j in jobs]
    run_until_idle(engine)
    assert engine.sampler.graphs.replays > 0
    for j, h in zip(jobs, handles, strict=True):
        assert torch.equal(h.future.result(timeout=0).tokens, solo(j))


def test_replays_read_the_static_inputs_and_hand_out_copies(monkeypatch: pytest.MonkeyPatch):
    """The bookkeeping around a graph, on any device: a stand-in graph whose replay recomputes
    the step from the captured static inputs into the captured outputs (what a CUDA graph does).
    One capture per shape and plan; every later block is copied in, replayed and cloned out."""
    from sedd.diffusion.cuda_graphs import _Captured

    graphed = sampler(True)
    graphed.graphs.enabled = True

    class StandIn:
        def __init__(self, rows: StepRows, plan: StepBranches, amp: bool, outputs) -> None:
            self.rows, self.plan, self.amp, self.outputs = rows, plan, amp, outputs

        def replay(self) -> None:
            fresh = graphed._block_step(self.rows, self.plan, self.amp)
            for static, value in zip(self.outputs, fresh, strict=True):
                if static is not None:  # the expected counts, where no row asks for them
                    static.copy_(value)

    def capture(rows: StepRows, plan: StepBranches, amp: bool) -> _Captured:
        inputs = [None if v is None else v.clone() for v in rows.tensors()]
        static = StepRows.from_tensors(inputs)
        outputs = graphed._block_step(static, plan, amp)
        graphed.graphs.captures += 1
        return _Captured(StandIn(static, plan, amp, outputs), inputs, outputs)

    monkeypatch.setattr(graphed.graphs, "_capture", capture)
    got = run_jobs(graphed, mixed_jobs())
    counts = graphed.graphs.captures, graphed.graphs.replays
    assert 1 <= counts[0] <= 4 and counts[1] > 5 * counts[0]  # a few plans, many replays
    for a, b in zip(got, run_jobs(sampler(False), mixed_jobs()), strict=True):
        assert torch.equal(a, b)
