"""Four kinds of GPU bug the emulated lane must catch (issue 45, item 4), each planted in the
product code by a test here and caught by the lane's own check, and the lane at a GPU's real
block size. The event-loop kind is in tests/server/test_cuda_event_loop.py.

* formatting a device tensor inside the step (a sync on a GPU): the one-sync-a-tick check;
* a non-blocking device-to-host readback read before it lands (a race on a GPU): the emulator
  refuses the read (``sedd.cuda_emulation.host_copies``);
* a CUDA-graph key that leaves out a step branch (tempered cells replayed from an untempered
  capture): tempered cells after an untempered capture must equal the CPU's;
* ``cpu_tensor[cuda_index]``, which a GPU refuses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from devices import needs_emulator

import sedd
from sedd.cuda_emulation.host_copies import ReadBeforeLandedError
from sedd.diffusion.cuda_graphs import GraphedSteps
from sedd.diffusion.sampling import Sampler
from sedd.engine import forwards
from sedd.engine.stepping import Stepper

pytestmark = needs_emulator
REQUEST = dict(num_cells=2, condition="CD19+ B", steps=3, seed=11, progress=False)


def lane_check(emulator, *, graphs: bool = False, requests: tuple[dict, ...] = (REQUEST,)):
    """The lane's check of ``generate`` on CUDA: each request's cells equal the CPU's bit for
    bit (requests run in order on one model, so graphs captured by one serve the next) and no
    tick makes more than one host sync."""
    cpu = sedd.load(device="cpu", precision="fp32")
    model = sedd.load(device="cuda", precision="fp32", cuda_graphs=graphs)
    per_tick: list[int] = []
    step = Stepper.step

    def counted(self: Stepper, blocks: list) -> None:
        before = len([s for s in emulator.syncs if s.kind != "capture"])
        step(self, blocks)
        per_tick.append(len([s for s in emulator.syncs if s.kind != "capture"]) - before)

    Stepper.step = counted  # type: ignore[method-assign]
    try:
        for request in requests:
            cells = model.generate(**request)  # type: ignore[arg-type]
            alone = cpu.generate(**request)  # type: ignore[arg-type]
            assert (cells.X != alone.X).nnz == 0, f"cells differ from the CPU's for {request}"
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    assert per_tick and max(per_tick) <= 1, f"host syncs per tick: {per_tick}"


def test_formatting_a_device_tensor_in_the_step_fails_the_lane(emulator, monkeypatch):
    lane_check(emulator)  # the code as it is passes
    propose = Sampler.propose

    def chatty(self, rows, plan, **kwargs):  # a debug line left in the step
        _ = f"stepping {rows.x}"
        return propose(self, rows, plan, **kwargs)

    monkeypatch.setattr(Sampler, "propose", chatty)
    with pytest.raises(AssertionError, match="host syncs per tick"):
        lane_check(emulator)


def test_a_readback_read_before_it_lands_fails_the_lane(emulator, monkeypatch):
    def racy(self: Stepper, proposals: list) -> object:  # non-blocking, read at once
        self.readbacks += 1
        return torch.cat([p.summary() for p in proposals]).to("cpu", non_blocking=True).numpy()

    monkeypatch.setattr(Stepper, "_read_back", racy)
    with pytest.raises(ReadBeforeLandedError, match="still writing"):
        lane_check(emulator)


def test_a_non_blocking_readback_read_after_a_sync_is_its_values(emulator):
    values = torch.arange(6, device="cuda")
    syncs = len(emulator.syncs)
    host = values.to("cpu", non_blocking=True)
    assert len(emulator.syncs) == syncs  # no wait: the copy is under way
    assert host.shape == (6,) and host.dtype == torch.int64  # its shape may be read
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    assert host.tolist() == [0, 1, 2, 3, 4, 5]


TEMPERED = {**REQUEST, "temperature": 0.5}


def test_tempered_cells_after_an_untempered_capture_equal_the_cpus(emulator):
    lane_check(emulator, graphs=True, requests=(REQUEST, TEMPERED))


def test_a_graph_key_without_the_temperature_branch_fails_the_lane(emulator, monkeypatch):
    key = GraphedSteps.key

    def forgetful(values, branches, amp):  # the branch flag left out of the key
        return key(values, dataclasses.replace(branches, any_tempered=True), amp)

    monkeypatch.setattr(GraphedSteps, "key", staticmethod(forgetful))
    with pytest.raises(AssertionError, match="cells differ from the CPU's"):
        lane_check(emulator, graphs=True, requests=(REQUEST, TEMPERED))


def test_indexing_a_host_tensor_with_a_device_index_raises_as_on_a_gpu(emulator):
    host, index = torch.arange(5), torch.tensor([1, 3], device="cuda")
    with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same"):
        host[index]
    with pytest.raises(RuntimeError, match="indices should be either on cpu or on the same"):
        host[index] = 0
    assert host.to("cuda")[index].cpu().tolist() == [1, 3]  # on the indexed tensor's device


@pytest.mark.slow
def test_the_lane_at_a_gpus_block_size(emulator, monkeypatch):
    """The lane's other tests run the CPU's row block (tests/conftest.py); this one a GPU's:
    131,072 tokens, 171 rows of the bundled model's 765 genes. Cells equal the CPU's run on the
    same block, with one sync a tick."""
    gpu_tokens = 131072
    monkeypatch.setitem(forwards.DEFAULT_TOKENS_PER_FORWARD, "cuda", gpu_tokens)
    model = sedd.load(device="cuda", precision="fp32")
    cpu = sedd.load(device="cpu", precision="fp32", tokens_per_forward=gpu_tokens)
    request = {**REQUEST, "steps": 2}
    cells = model.generate(**request)  # type: ignore[arg-type]
    (sampler,) = model._samplers.values()
    assert sampler.block_rows == gpu_tokens // 765 == 171
    assert (cells.X != cpu.generate(**request).X).nnz == 0  # type: ignore[arg-type]
