"""Model FLOPs per forward and MFU: achieved FLOP/s over a matmul's, measured in the same run.

``torch.utils.flop_counter`` counts matmuls and attention, but has no formula for the CPU's
attention kernel (``_scaled_dot_product_flash_attention_for_cpu``); ``forward_flops`` adds it
with torch's own SDPA formula, 4 L^2 d per head and row (QK^T and PV), so CPU MFU is not
understated by the share attention takes.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from sedd.precision import PrecisionPolicy, ScoreModel, fp32_region

_CPU_SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def forward_flops(model: ScoreModel, x: torch.Tensor, sigma: torch.Tensor, **conditioning) -> int:
    """FLOPs of one ``model(x, sigma, ...)`` forward (fp32, no autocast), attention included."""
    counter = FlopCounterMode(display=False, custom_mapping={_CPU_SDPA: _cpu_sdpa_flops})
    # no_grad, not inference_mode: views of inference tensors under the FLOP counter's mode
    # cannot take a version counter on wrapper tensors (the emulated CUDA lane's)
    with torch.no_grad(), fp32_region(x.device.type), counter:
        model(x, sigma, **conditioning)
    return int(counter.get_total_flops())


def matmul_flops_per_s(
    device: torch.device, dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5
) -> float:
    """FLOP/s of a size x size matmul in ``dtype`` on ``device``: the peak MFU is taken against."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def forward_seconds(
    model: ScoreModel,
    policy: PrecisionPolicy,
    x: torch.Tensor,
    sigma: torch.Tensor,
    repeats: int = 10,
    **conditioning,
) -> float:
    """Median wall time of one forward under ``policy`` (its autocast), after a warm-up."""
    times = []
    for i in range(repeats + 2):
        _sync(x.device)
        start = time.perf_counter()
        with torch.inference_mode(), policy.autocast():
            model(x, sigma, **conditioning)
        _sync(x.device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
