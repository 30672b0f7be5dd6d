"""``OpCounter``: what each op on emulated CUDA would cost a GPU, in FLOPs and bytes, by rule.

Every figure here is counted by hand: a (64, 32) fp32 tensor is 8,192 bytes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from devices import EMULATED

from sedd.cuda_emulation import emulate_cuda
from sedd.cuda_emulation.roofline import OpCounter

# slow: an emulation builds its C++ device guard first (tests/cuda_emulation/test_emulator.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(EMULATED, reason="the whole session is emulated already"),
]

KB8 = 64 * 32 * 4  # one (64, 32) fp32 tensor


@pytest.fixture(params=["meta", "cpu"])
def count(request) -> Iterator[OpCounter]:
    with emulate_cuda(backing=request.param) as emulator:
        counter = OpCounter(region="here")
        with counter.counting(emulator):
            yield counter


def costs(counter: OpCounter, kind: str = "other") -> tuple[float, float, int]:
    cost = counter.costs[("here", kind)]
    return cost.flops, cost.bytes, cost.ops


def test_an_elementwise_op_reads_its_inputs_and_writes_its_output(count: OpCounter):
    x = torch.empty(64, 32, device="cuda")
    count.costs.clear()
    x + x
    x.mul_(2.0)
    assert costs(count) == (0.0, 3 * KB8 + 2 * KB8, 2)


def test_views_and_handed_back_inputs_move_nothing(count: OpCounter):
    x = torch.empty(64, 32, device="cuda")
    count.costs.clear()
    x.t(), x[:, :5], x.view(32, 64), x.chunk(4, dim=-1), x.float()
    F.dropout(x, 0.1, training=False)
    assert costs(count)[1] == 0.0


def test_a_cast_copy_and_a_store_count_what_they_read_and_write(count: OpCounter):
    x = torch.empty(64, 32, device="cuda")
    y = torch.empty(64, 32, device="cuda", dtype=torch.float64)
    count.costs.clear()
    x.double()  # reads fp32, writes fp64
    y.copy_(x)  # the same: the destination is not read
    y.fill_(0.0)
    assert costs(count)[1] == 3 * KB8 + 3 * KB8 + 2 * KB8


def test_copies_inside_an_op_count(count: OpCounter):
    x = torch.empty(64, 33, device="cuda")[:, :32]  # strided rows
    count.costs.clear()
    torch.softmax(x, dim=-1)  # copies the strided input to contiguous rows first
    assert costs(count)[1] == 2 * KB8 + 2 * KB8
    count.costs.clear()
    torch.cumsum(x.contiguous(), dim=-1, dtype=torch.float64)  # casts, then scans the cast
    assert costs(count)[1] == 2 * KB8 + (KB8 + 2 * KB8) + (2 * KB8 + 2 * KB8)
    count.costs.clear()
    torch.sum(x.double(), dim=-1, dtype=torch.float32)  # casts back, then reduces the cast
    assert costs(count)[1] == 3 * KB8 + (2 * KB8 + KB8) + (KB8 + 64 * 4)


def test_gathers_read_what_they_pick(count: OpCounter):
    table = torch.empty(1000, 32, device="cuda")
    index = torch.zeros(64, dtype=torch.long, device="cuda")
    cdf = torch.empty(64, 1023, device="cuda", dtype=torch.float64)
    count.costs.clear()
    F.embedding(index, table)  # 64 rows of 32, not the table
    assert costs(count)[1] == 64 * 8 + 2 * KB8
    count.costs.clear()
    torch.searchsorted(cdf, torch.empty(64, 1, device="cuda", dtype=torch.float64))
    assert costs(count)[1] == 64 * 8 + 64 * 10 * 32 + 64 * 8  # 10 probes of a 32-byte sector


def test_gemm_flops_come_from_the_flop_counter_formulas(count: OpCounter):
    x, w = torch.empty(3, 64, 32, device="cuda"), torch.empty(48, 32, device="cuda")
    count.costs.clear()
    F.linear(x, w)
    x @ torch.empty(32, 16, device="cuda")
    flops, moved, ops = costs(count, "gemm")
    assert flops == 2 * 192 * 48 * 32 + 2 * 192 * 16 * 32 and ops == 2
    assert moved == (3 * KB8 + 48 * 32 * 4 + 192 * 48 * 4) + (3 * KB8 + 32 * 16 * 4 + 192 * 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_counts_as_one_flash_call_whatever_kernel_ran(count: OpCounter, dtype):
    b, h, length, d = 2, 4, 128, 32
    q, k, v = (torch.empty(b, h, length, d, device="cuda", dtype=dtype) for _ in range(3))
    count.costs.clear()
    F.scaled_dot_product_attention(q, k, v)
    flops, moved, ops = costs(count, "attention")
    assert (flops, ops) == (4 * b * h * length * length * d, 1)  # QK^T and PV, no L x L in bytes
    assert moved == 4 * b * h * length * d * q.element_size()
    assert costs(count) == (0.0, 0.0, 0)  # nothing inside the call counted apart
