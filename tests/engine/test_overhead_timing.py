"""``sedd bench --overhead`` on (emulated) CUDA times the host with the host clock and the device
with CUDA events, apart, and counts one sync a tick (the readback).

On CUDA the tick waits for the device at its readback. CUDA events around the whole tick time
the host's own work too (the device idles through it between them), so host ms came out near 0;
and CUDA's sync debug mode does not see ``torch.cuda.synchronize``, so subtracting one for it
halved two ticks' two readbacks to 0.5 a tick. Here the host's work after the readback is a
20 ms sleep and the device's wait at the readback a 30 ms one: the first is host time, the
second is not."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from devices import needs_emulator

from sedd.bench.overhead import cuda_syncs, measure, small_model
from sedd.cli import main
from sedd.defaults import SamplingOptions
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, EngineJob, ModelLimits
from sedd.engine.stepping import Stepper
from sedd.precision import resolve_precision

pytestmark = needs_emulator

HOST_S, WAIT_S = 0.020, 0.030


def test_cuda_syncs_counts_one_readback_a_tick_not_half():
    model, noise, graph = small_model(device="cuda")
    sampler = Sampler(model, noise, graph, precision=resolve_precision("fp32", "cuda"),
                      block_rows=4)  # fmt: skip
    engine = Engine(sampler, ModelLimits.of_module(model, 64), max_rows_per_forward=4)
    engine.submit(EngineJob(4, SamplingOptions(12, seed=0)))
    engine.tick()
    engine.tick()
    assert cuda_syncs(engine, 2) == 1  # two ticks, two readbacks
    engine.stop(drain=False)


def test_host_ms_is_the_hosts_own_work_not_the_wait_for_the_device(monkeypatch):
    settle, read_back = Stepper._settle, Stepper._read_back

    def slow_settle(self, *args, **kwargs):  # host work after the readback
        time.sleep(HOST_S)
        return settle(self, *args, **kwargs)

    def waiting_read_back(self, *args, **kwargs):  # the host waits for the device here
        time.sleep(WAIT_S)
        return read_back(self, *args, **kwargs)

    monkeypatch.setattr(Stepper, "_settle", slow_settle)
    monkeypatch.setattr(Stepper, "_read_back", waiting_read_back)
    model, noise, graph = small_model(device="cuda")
    policy = resolve_precision("fp32", "cuda")
    (figure,) = measure(model, noise, graph, policy, 64, [2], ticks=2)
    assert figure.host_ms >= 1000 * HOST_S  # CUDA events over the whole tick: about 0
    assert figure.tick_ms >= 1000 * (HOST_S + WAIT_S)
    assert figure.host_ms <= figure.tick_ms - 1000 * WAIT_S  # the wait is not host work
    assert 0 < figure.forward_ms < figure.tick_ms - 1000 * HOST_S  # the step, not the settling
    assert figure.syncs == 1


@pytest.mark.parametrize("graphs", [False, True])
def test_bench_overhead_on_cuda_reports_host_and_device_apart(graphs, tmp_path: Path, capsys):
    out = tmp_path / "overhead.json"
    flag = "--cuda-graphs" if graphs else "--no-cuda-graphs"
    assert main(["bench", "--overhead", "--device", "cuda", flag, "--rows", "1", "4", "--ticks",
                 "1", "--precision", "fp32", "--out", str(out)]) == 0  # fmt: skip
    assert "device ms (CUDA events)" in capsys.readouterr().out
    figures = json.loads(out.read_text())["figures"]
    assert [f["syncs"] for f in figures] == [1, 1]
    assert all(f["host_ms"] > 0 and f["forward_ms"] > 0 and f["tick_ms"] > 0 for f in figures)
