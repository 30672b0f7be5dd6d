"""The emulated CUDA lane can fail: a device mix raises, a sync inside a step is counted, a
replayed graph that reads freed memory is reported, a sync while capturing raises, memory runs
out. These run in the plain CPU suite (CI's slow step, ``-m slow``), each inside its own
``emulate_cuda()``; the lane itself is ``SEDD_EMULATE_CUDA=1 pytest`` (``tests/conftest.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch
from devices import EMULATED
from engine_models import job, tiny_loaded

from sedd.cuda_emulation import (
    DeviceSpec,
    EmulatedCudaError,
    EmulatedCudaTensor,
    Emulator,
    FreedGraphInputError,
    emulate_cuda,
)
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, ModelLimits
from sedd.engine.stepping import Stepper
from sedd.precision import PrecisionPolicy

# slow: the first emulation in a process builds its C++ device guard (about 20 s, once per
# torch installation): CI's slow step runs these, the README's command does not
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(EMULATED, reason="the whole session is emulated already"),
]


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with emulate_cuda() as emu:
        yield emu


def test_cuda_tensors_report_cuda_and_keep_cpu_values(emu: Emulator):
    x = torch.arange(6, device="cuda").float()
    assert torch.cuda.is_available() and x.device == torch.device("cuda", 0)
    assert isinstance(x, EmulatedCudaTensor)
    y = (x * 2 + 1)[2:4]
    assert torch.equal(y.cpu(), torch.tensor([5.0, 7.0]))
    with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
        y.numpy()


def test_a_device_mix_raises_as_on_a_gpu(emu: Emulator):
    on_gpu, on_cpu = torch.ones(3, device="cuda"), torch.ones(3)
    with pytest.raises(RuntimeError, match="found at least two devices, cuda:0 and cpu"):
        _ = on_gpu + on_cpu
    assert torch.equal((on_gpu + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # 0-dim: fine


def test_views_follow_inference_mode_as_on_a_gpu(emu: Emulator):
    """A view made under inference mode of a tensor made outside it is a normal tensor (DDiT's
    forward indexes its input so); anything else made under inference mode is an inference
    tensor, and writing into one outside it raises as on a GPU."""
    x = torch.arange(6, device="cuda")
    with torch.inference_mode():
        view = x[..., None]
        made = x * 2
        view_of_made = made[1:]
    assert not view.is_inference() and view.shape == (6, 1)
    assert torch.equal(view.cpu()[:, 0], torch.arange(6))
    x[0] = 9  # the view shares the data
    assert int(view[0, 0].cpu()) == 9
    assert made.is_inference() and view_of_made.is_inference()
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
        made.add_(1)


def test_the_real_cuda_autocast_policy_applies(emu: Emulator):
    layer = torch.nn.Linear(8, 4).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(torch.ones(2, 8, device="cuda"))
        soft = torch.softmax(out, dim=-1)
    assert out.dtype == torch.bfloat16 and soft.dtype == torch.float32  # CUDA's fp32 list
    assert layer.weight.dtype == torch.float32 and layer.weight.device.type == "cuda"


def test_syncs_are_recorded_with_kind_and_site(emu: Emulator):
    x = torch.ones(4, device="cuda")
    emu.syncs.clear()
    _ = x.sum().item()
    _ = x[x > 0]  # boolean indexing waits for the count
    _ = x.cpu()
    _ = torch.ones(4).to("cuda")  # pageable upload
    _ = torch.ones(4).pin_memory().to("cuda", non_blocking=True)  # asynchronous: no sync
    kinds = [s.kind for s in emu.syncs]
    assert kinds == ["item", "boolean_index", "device_to_host", "host_to_device"]
    assert all("test_emulator.py" in s.where for s in emu.syncs)


def _engine(loaded, emulator: Emulator) -> Engine:
    loaded.model.to("cuda")
    policy = PrecisionPolicy(device=torch.device("cuda"), amp_dtype=None)
    sampler = Sampler(loaded.model, loaded.noise, loaded.graph, precision=policy, block_rows=4)
    return Engine(sampler, ModelLimits.of_model(loaded), max_rows_per_forward=8)


def _syncs_in_steps(emu: Emulator, engine: Engine) -> list[int]:
    """Syncs made inside each ``Stepper.step`` while ``engine`` runs one job to its end."""
    per_step: list[int] = []
    step = Stepper.step

    def counted(self: Stepper, blocks: list) -> None:
        before = len(emu.syncs)
        step(self, blocks)
        per_step.append(len(emu.syncs) - before)

    Stepper.step = counted  # type: ignore[method-assign]
    try:
        handle = engine.submit(job(3, steps=4, seed=1, label=1))
        while engine.tick():
            pass
        handle.future.result(timeout=0)
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    return per_step


def test_a_sync_inside_the_step_is_counted(emu: Emulator, monkeypatch: pytest.MonkeyPatch):
    loaded = tiny_loaded()
    engine = _engine(loaded, emu)
    clean = _syncs_in_steps(emu, engine)
    assert next(engine.sampler.model.parameters()).device.type == "cuda"
    block_step = engine.sampler._block_step

    def with_item(rows, plan, amp):
        _ = float(rows.t.max().item())  # the kind of line that stalls a GPU every step
        return block_step(rows, plan, amp)

    monkeypatch.setattr(engine.sampler.graphs, "step", with_item)
    dirty = _syncs_in_steps(emu, engine)
    # 4 steps; the cells' genes are all drawn by then, so they leave without the denoise tick
    assert len(dirty) == len(clean) == 4
    assert [d - c for d, c in zip(dirty, clean, strict=True)] == [1, 1, 1, 1]
    assert clean == [1, 1, 1, 1]  # the tick's one readback
    items = [s for s in emu.syncs if s.kind == "item"]
    assert len(items) == 4 and all("test_emulator.py" in s.where for s in items)


def _captured(x: torch.Tensor, table: torch.Tensor) -> tuple[object, torch.Tensor]:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()), torch.cuda.graph(graph):
        out = x * table
    return graph, out


def test_a_replay_equals_the_capture_on_new_inputs(emu: Emulator):
    x, table = torch.ones(4, device="cuda"), torch.full((4,), 3.0, device="cuda")
    graph, out = _captured(x, table)
    table.fill_(5.0)
    graph.replay()
    assert torch.equal(out.cpu(), torch.full((4,), 5.0))


def test_a_replayed_cast_is_computed_again(emu: Emulator):
    # aten.to.dtype is declared an alias of its input; a cast still makes a new tensor, which
    # the replay must write again (autocast's casts of the weights are such casts)
    x = torch.full((4,), 1.5, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()), torch.cuda.graph(graph):
        out = x.to(torch.bfloat16) * 2
    x.fill_(3.0)
    graph.replay()
    assert torch.equal(out.cpu(), torch.full((4,), 6.0, dtype=torch.bfloat16))


def test_a_replay_reading_a_freed_tensor_is_reported(emu: Emulator):
    x, table = torch.ones(4, device="cuda"), torch.full((4,), 3.0, device="cuda")
    graph, _ = _captured(x, table)
    graph.replay()
    del table  # e.g. a cache that replaced its table: the graph still points at the old one
    gc.collect()
    with pytest.raises(FreedGraphInputError, match=r"reads a 4 torch\.float32 tensor"):
        graph.replay()


def test_a_sync_while_capturing_raises(emu: Emulator):
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with (
        pytest.raises(EmulatedCudaError, match="not permitted when stream is capturing"),
        torch.cuda.stream(torch.cuda.Stream()),
        torch.cuda.graph(graph),
    ):
        _ = x.sum().item()


def test_memory_is_counted_and_runs_out():
    with emulate_cuda(devices=[DeviceSpec(total_memory=1 << 20)]):
        base = torch.cuda.memory_allocated()
        x = torch.empty(1000, dtype=torch.float32, device="cuda")
        assert torch.cuda.memory_allocated() - base == 4000
        view = x[10:]
        del x
        gc.collect()
        assert torch.cuda.memory_allocated() - base == 4000  # the view keeps the storage
        del view
        gc.collect()
        assert torch.cuda.memory_allocated() == base
        assert torch.cuda.max_memory_allocated() >= 4000
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
            torch.empty(1 << 20, device="cuda")


def test_meta_backing_holds_the_k562_shape_without_memory():
    with emulate_cuda(backing="meta"):
        logits = torch.empty(15, 8563, 1725, dtype=torch.float32, device="cuda")
        assert logits.backing.device.type == "meta"
        assert torch.cuda.memory_allocated() == 15 * 8563 * 1725 * 4
