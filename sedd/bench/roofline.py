"""FLOPs, bytes and peak memory of one block step, by part, for any model shape (``sedd bench
--roofline``): what a GPU's time is made of, without a GPU.

One fixed-shape block step (``Sampler._block_step``: the forward, the transition, the fp64 draw;
what a CUDA graph captures) of a random-weight st3 perturbation transformer runs on emulated
CUDA with ``meta`` backing (``sedd.cuda_emulation``): shapes only, so the real K562 shape takes
seconds. Every aten op is attributed to a part:

* ``attention``: scaled dot-product attention, counted as flash attention runs it (4·B·h·L²·d
  FLOPs; reads q, k, v and writes the output once: no L×L matrix);
* ``linear``: the GEMMs (2·M·N·K FLOPs);
* ``elementwise``: every other op inside the model forward (norms, activations, RoPE, casts);
* ``sampler tail``: everything after the forward returns (scaling, softmax, the fp64 CDF and
  draw, the bookkeeping).

Bytes are an op's tensor inputs read plus its fresh outputs written (a view moves nothing): the
traffic of unfused kernels, an upper bound where a GPU would fuse. Peak memory is the emulator's
count of live device tensors during the step. None of this is a timing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

PARTS = ("attention", "linear", "elementwise", "sampler tail")
_GEMMS = {"linear", "mm", "addmm", "bmm", "matmul", "baddbmm"}
_ALLOCATIONS = {"empty", "empty_like", "new_empty", "empty_strided"}  # write nothing
_VIEWS_FREE = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
               "unsqueeze", "squeeze", "select", "slice", "alias", "detach", "as_strided",
               "split", "chunk", "unbind", "view_as", "unflatten", "flatten"}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """A model and block shape: genes, count bins, hidden/layers/heads, rows a block."""

    genes: int = 8563
    bins: int = 1724
    hidden: int = 256
    layers: int = 8
    heads: int = 8
    rows: int = 15  # the CUDA default: 131,072 tokens / 8,563 genes

    @property
    def vocab(self) -> int:
        return self.bins + 1


@dataclass
class Roofline:
    """Per part: FLOPs and bytes of one block step; the step's peak device memory."""

    shape: Shape
    precision: str
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    peak_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.__dict__,
            "precision": self.precision,
            "parts": {
                p: {"flops": self.flops[p], "bytes": self.bytes[p], "ops": self.ops[p]}
                for p in PARTS
            },
            "total_flops": sum(self.flops.values()),
            "total_bytes": sum(self.bytes.values()),
            "peak_bytes": self.peak_bytes,
        }


def _nbytes(t: Any) -> int:
    backing = getattr(t, "backing", t)
    return backing.numel() * backing.element_size()


def _op_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[str | None, float, float]:
    """(kind, FLOPs, bytes) of one op; kind "attention", "linear" or None (element-wise)."""
    name = func.overloadpacket.__name__.rstrip("_")
    if name == "scaled_dot_product_attention":
        q, k, v = args[:3]
        *batch, length, head = q.shape
        flops = 4.0 * torch.Size(batch).numel() * length * k.shape[-2] * head
        return "attention", flops, float(sum(_nbytes(t) for t in (q, k, v)) + _nbytes(q))
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if name in _VIEWS_FREE or name in _ALLOCATIONS:
        return None, 0.0, 0.0
    given = {k: v for k, v in kwargs.items() if k != "out"}  # an out= tensor is written, not read
    ins = [t for t in tree_flatten((args, given))[0] if isinstance(t, torch.Tensor)]
    moved = float(sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs))
    if name in _GEMMS and outs:
        k_dim = ins[0].shape[-1] if name != "addmm" else ins[1].shape[-1]
        return "linear", 2.0 * outs[0].numel() * k_dim, moved
    return None, 0.0, moved


def block_step_roofline(shape: Shape, precision: str = "bf16") -> Roofline:
    """Run one block step of a random-weight model of ``shape`` on meta-backed emulated CUDA and
    attribute every op (see the module docstring). Must not run inside another emulation."""
    from sedd.cuda_emulation import emulate_cuda
    from sedd.diffusion.graph import graph_from_config
    from sedd.diffusion.noise import noise_from_config
    from sedd.diffusion.sampling import Sampler, StepPlan, StepRows
    from sedd.models.st3 import SEDDPerturbationTransformer
    from sedd.precision import resolve_precision

    result = Roofline(shape, precision)
    in_model = [False]

    def observe(func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        kind, flops, moved = _op_cost(func, args, kwargs, out)
        part = (kind or "elementwise") if in_model[0] else "sampler tail"
        result.flops[part] += flops
        result.bytes[part] += moved
        result.ops[part] += 1

    with emulate_cuda(backing="meta") as emulator:
        with torch.device("meta"):
            model = SEDDPerturbationTransformer(
                num_genes=shape.genes, num_bins=shape.bins, hidden_dim=shape.hidden,
                num_layers=shape.layers, num_heads=shape.heads, num_perturbations=16,
            )  # fmt: skip
        model = model.to("cuda").eval()
        model.register_forward_pre_hook(lambda *_: in_model.__setitem__(0, True))
        model.register_forward_hook(lambda *_: in_model.__setitem__(0, False))
        graph = graph_from_config({"type": "absorb", "dim": shape.vocab})
        noise = noise_from_config({"type": "loglinear", "eps": 1e-3})
        policy = resolve_precision(precision, "cuda")
        sampler = Sampler(model, noise, graph, precision=policy, block_rows=shape.rows)
        x = torch.full((shape.rows, shape.genes), shape.bins, device="cuda")  # all masked
        labels = torch.zeros(shape.rows, dtype=torch.long, device="cuda")
        rows = StepRows.of_request(x, 0.8, 0.6, labels=labels)
        plan = StepPlan(any_final=False, any_euler=True, any_tweedie=False, any_tempered=False)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        emulator.observers.append(observe)
        sampler._block_step(rows, plan, True)
        emulator.observers.remove(observe)
        result.peak_bytes = torch.cuda.max_memory_allocated() - base
    return result


# H100 SXM peaks, for estimates only: dense bf16 tensor-core FLOP/s and HBM3 bandwidth
H100_BF16_FLOPS = 989e12
H100_BYTES_PER_S = 3.35e12


def estimated_seconds(roofline: Roofline, mfu: float) -> float:
    """An ESTIMATE of one block step on an H100: the FLOP-bound parts at ``mfu`` of the bf16
    peak, plus the element-wise and sampler-tail bytes at full HBM bandwidth (no overlap)."""
    compute = (roofline.flops["attention"] + roofline.flops["linear"]) / (mfu * H100_BF16_FLOPS)
    traffic = (roofline.bytes["elementwise"] + roofline.bytes["sampler tail"]) / H100_BYTES_PER_S
    return compute + traffic


def plan_table(shapes: dict[str, Shape], steps: tuple[int, ...] = (10, 50)) -> list[dict]:
    """Estimated H100 cells/s and GPU-hours per million cells, at 15% and 20% MFU."""
    rows: list[dict] = []
    for name, shape in shapes.items():
        roofline = block_step_roofline(shape)
        for n in steps:
            for mfu in (0.15, 0.20):
                per_cell = (n + 1) * estimated_seconds(roofline, mfu) / shape.rows
                rows.append({"model": name, "steps": n, "mfu": mfu, "cells_per_s": 1 / per_cell,
                             "gpu_hours_per_million": per_cell * 1e6 / 3600})  # fmt: skip
    return rows


def by_part(rooflines: list[Roofline]) -> dict[str, dict[str, float]]:
    """Per part, the sum over ``rooflines`` (e.g. several precisions), for comparisons."""
    summed: dict[str, dict[str, float]] = defaultdict(lambda: {"flops": 0.0, "bytes": 0.0})
    for r in rooflines:
        for p in PARTS:
            summed[p]["flops"] += r.flops[p]
            summed[p]["bytes"] += r.bytes[p]
    return dict(summed)
