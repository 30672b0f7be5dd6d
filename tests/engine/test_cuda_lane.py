"""What a first H100 run would hit, checked on the emulated CUDA lane (``SEDD_EMULATE_CUDA=1``):
cells equal the CPU's bit for bit with and without CUDA graphs, a tick makes one host sync, a
second GPU captures and replays on its own stream, an fp32 recomputation does not free what a
captured graph reads, and graphs are captured once per loaded model."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from devices import needs_emulator
from engine_models import job, run_until_idle, tiny_loaded

import sedd
from sedd.cli import main
from sedd.diffusion.sampling import Sampler, StepBranches, StepRows
from sedd.engine import Engine, ModelLimits
from sedd.engine.stepping import Stepper
from sedd.precision import resolve_precision

pytestmark = needs_emulator


def test_auto_precision_asks_the_requested_gpu_not_the_current_one():
    # the lane's cuda:0 is an H100 (sm 9.0), its cuda:1 a V100 (sm 7.0, no native bf16)
    assert torch.cuda.current_device() == 0
    assert resolve_precision("auto", "cuda:0").name == "bf16"
    assert resolve_precision("auto", "cuda:1").name == "fp32"


def _run(loaded, sampler: Sampler) -> list[torch.Tensor]:
    engine = Engine(sampler, ModelLimits.of_model(loaded), max_rows_per_forward=8)
    jobs = [job(5, steps=3, seed=1), job(2, steps=4, seed=2, label=3, temperature=0.7)]
    handles = [engine.submit(j) for j in jobs]
    run_until_idle(engine)
    return [h.future.result(timeout=0).tokens for h in handles]


def _sampler(loaded, device: str, graphs: bool, precision: str = "fp32") -> Sampler:
    policy = resolve_precision(precision, device)
    return Sampler(loaded.model, loaded.noise, loaded.graph, precision=policy, device=device,
                   block_rows=4, cuda_graphs=graphs)  # fmt: skip


def test_graphs_on_a_second_gpu_capture_and_replay_on_it():
    loaded = tiny_loaded()
    loaded.model.to("cuda:1")
    graphed = _sampler(loaded, "cuda:1", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed capture warns and goes eager: not here
        got = _run(loaded, graphed)
    assert graphed.graphs.enabled and graphed.graphs.captures >= 1
    assert graphed.graphs.replays > graphed.graphs.captures
    eager = _run(loaded, _sampler(loaded, "cuda:1", False))
    assert all(torch.equal(a, b) for a, b in zip(got, eager, strict=True))


def test_an_fp32_recomputation_keeps_what_a_captured_bf16_graph_reads():
    loaded = tiny_loaded()
    loaded.model.to("cuda")
    sampler = _sampler(loaded, "cuda", True, "bf16")
    mask = loaded.graph.dim - 1
    x = torch.full((4, loaded.config.num_genes), mask, device="cuda")
    rows = StepRows.of_request(x, 0.8, 0.6, seed=4, labels=torch.ones(4, dtype=torch.long,
                               device="cuda"), cell_types=torch.zeros(4, dtype=torch.long,
                               device="cuda"))  # fmt: skip
    plan = StepBranches(any_final=False, kinds=frozenset({"euler"}), any_tempered=False)
    first = sampler.propose(rows, plan).tokens.cpu()  # the bf16 graph
    sampler.propose(rows, plan, amp=False)  # rule 5's fp32 recomputation: a graph of its own
    gc.collect()
    again = sampler.propose(rows, plan).tokens.cpu()  # replays the bf16 graph
    assert sampler.graphs.captures == 2 and sampler.graphs.replays >= 1
    assert torch.equal(first, again)


@pytest.mark.parametrize("graphs", [False, True])
def test_generate_on_cuda_equals_the_cpu_with_one_sync_a_tick(graphs: bool, emulator):
    request = dict(num_cells=3, condition="CD19+ B", steps=4, seed=7, progress=False)
    cpu = sedd.load(device="cpu", precision="fp32").generate(**request)  # type: ignore[arg-type]
    model = sedd.load(device="cuda", precision="fp32", cuda_graphs=graphs)
    per_tick: list[int] = []
    step = Stepper.step

    def counted(self: Stepper, blocks: list) -> None:
        before = [s for s in emulator.syncs if s.kind != "capture"]
        step(self, blocks)
        per_tick.append(len([s for s in emulator.syncs if s.kind != "capture"]) - len(before))

    Stepper.step = counted  # type: ignore[method-assign]
    try:
        cells = model.generate(**request)  # type: ignore[arg-type]
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    assert (cells.X != cpu.X).nnz == 0  # bit for bit
    assert len(per_tick) >= 4 and max(per_tick) <= 1, per_tick
    (sampler,) = model._samplers.values()
    if graphs:
        captured = sampler.graphs.captures
        assert captured >= 1 and sampler.graphs.replays > 0
        model.generate(**request)  # type: ignore[arg-type]
        assert sampler.graphs.captures == captured  # kept per loaded model (bug 9)


@pytest.mark.parametrize("graph", ["uniform", "absorb"])
def test_reference_sedd_models_on_cuda_equal_the_cpu(graph: str):
    """The reference SEDD (DDiT) forward indexes its input under inference mode; on a GPU that
    view is a normal tensor, and the lane must run it so (it raised before)."""
    path = Path(__file__).parents[1] / "data" / "sedd_reference" / graph / "hf"
    request = dict(num_cells=3, steps=4, seed=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference models have positional genes
        cpu = sedd.load(path, device="cpu", precision="fp32").generate(**request)
        for graphs in (False, True):
            model = sedd.load(path, device="cuda", precision="fp32", cuda_graphs=graphs)
            cells = model.generate(**request)  # type: ignore[arg-type]
            assert (cells.X != cpu.X).nnz == 0  # bit for bit


@pytest.mark.parametrize("flag", ["--no-cuda-graphs", "--cuda-graphs"])
def test_sedd_generate_on_cuda_writes_the_cpus_cells(tmp_path: Path, flag: str):
    def run(device: str, *extra: str) -> np.ndarray:
        out = tmp_path / f"{device}{len(extra)}.h5ad"
        args = ["generate", "--conditions", "CD56+ NK", "--num-cells", "2", "--steps", "3",
                "--seed", "5", "--precision", "fp32", "--device", device, "--out", str(out),
                *extra]  # fmt: skip
        assert main(args) == 0
        import anndata

        return anndata.read_h5ad(out).X.toarray()

    np.testing.assert_array_equal(run("cuda", flag), run("cpu"))


@pytest.mark.parametrize("graphs", [False, True])
def test_bench_overhead_on_cuda_times_the_device_and_counts_every_sync(graphs: bool):
    from sedd.bench.overhead import measure, small_model

    model, noise, graph = small_model(device="cuda")
    policy = resolve_precision("fp32", "cuda")
    figures = measure(model, noise, graph, policy, 64, [1, 8], ticks=2, cuda_graphs=graphs)
    for f in figures:
        assert f.syncs == 1  # the readback; the per-row arrays cross asynchronously
        assert f.forward_ms > 0  # graph replays run no forward hooks: timed with CUDA events


def test_the_models_attention_is_flash_eligible_under_bf16(emulator):
    model = sedd.load(device="cuda", precision="bf16")
    emulator.attention.clear()
    model.generate(1, condition="CD19+ B", steps=1, seed=0, progress=False)
    assert emulator.attention and set(emulator.attention) == {"flash"}  # head size 32, no mask
    emulator.attention.clear()
    sedd.load(device="cuda", precision="fp32").generate(1, condition="CD19+ B", steps=1,
                                                         progress=False)  # fmt: skip
    assert set(emulator.attention) == {"dtype torch.float32 (flash needs fp16/bf16)"}
