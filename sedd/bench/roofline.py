"""FLOPs, bytes and peak memory of one block step, by part, for any model shape (``sedd bench
--roofline``): what a GPU's time is made of, without a GPU. Counted, not timed.

One fixed-shape block step (``Sampler._block_step``: the forward, the transition, the fp64 draw;
what a CUDA graph captures) of a random-weight st3 perturbation transformer runs on emulated
CUDA with ``meta`` backing (``sedd.cuda_emulation``): shapes only, so the real K562 shape takes
seconds. ``sedd.cuda_emulation.roofline.OpCounter`` prices every aten op (its rules: views move
nothing, copies ATen makes inside an op count, attention as flash attention runs it) and this
module sorts the ops into parts:

* ``attention``: each scaled dot-product attention call as one flash kernel (4·B·h·L²·d FLOPs;
  reads q, k, v and writes the output once: no L×L matrix);
* ``linear``: the GEMMs (2·M·N·K FLOPs, ``torch.utils.flop_counter``'s formulas);
* ``elementwise``: every other op inside the model forward (norms, activations, RoPE, casts);
* ``sampler tail``: everything outside the forward, i.e. after it returns (the cast of its
  output to fp32, the scale, softmax, the fp64 CDF and draw, the bookkeeping) and the few
  per-row ops before it (noise levels, positions left to change).

Bytes are an op's inputs read plus its fresh outputs written: the traffic of unfused kernels,
an upper bound where a GPU would fuse. Peak memory is the emulator's count of live device
tensors during the step. ``plan_table`` turns a step's counts into an ESTIMATE of H100 cells/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

PARTS = ("attention", "linear", "elementwise", "sampler tail")
_IN_MODEL = {"attention": "attention", "gemm": "linear", "other": "elementwise"}


@dataclass(frozen=True)
class Shape:
    """A model and block shape: genes, count bins, hidden/layers/heads, rows a block."""

    genes: int = 8563
    bins: int = 1724
    hidden: int = 256
    layers: int = 8
    heads: int = 8
    rows: int = 15  # the CUDA default block: 131,072 tokens a forward // 8,563 genes

    @property
    def vocab(self) -> int:
        return self.bins + 1

    def label(self) -> str:
        """``GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS``, what ``--roofline-shape`` takes."""
        g, b, h, n, k, r = self.genes, self.bins, self.hidden, self.layers, self.heads, self.rows
        return f"{g}x{b}:{h}/{n}/{k}:{r}"


@dataclass
class Roofline:
    """Per part: FLOPs, bytes and ops of one block step; the step's peak device memory."""

    shape: Shape
    precision: str
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    peak_bytes: int = 0

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.__dict__,
            "precision": self.precision,
            "parts": {
                p: {"flops": self.flops[p], "bytes": self.bytes[p], "ops": self.ops[p]}
                for p in PARTS
            },
            "total_flops": self.total_flops,
            "total_bytes": self.total_bytes,
            "peak_bytes": self.peak_bytes,
        }


def block_step_roofline(
    shape: Shape, precision: Literal["bf16", "fp32"] = "bf16", perturbations: int = 16
) -> Roofline:
    """Run one all-masked Euler block step of a random-weight model of ``shape`` on meta-backed
    emulated CUDA and count it by part (see the module docstring). Must not run inside another
    emulation."""
    from sedd.cuda_emulation import emulate_cuda
    from sedd.cuda_emulation.roofline import OpCounter
    from sedd.diffusion.graph import AbsorbingGraph
    from sedd.diffusion.noise import LogLinearNoise
    from sedd.diffusion.sampling import Sampler, StepBranches, StepRows
    from sedd.models.st3 import SEDDPerturbationTransformer
    from sedd.precision import resolve_precision

    if precision not in ("bf16", "fp32"):
        raise ValueError(f"`precision` must be 'bf16' or 'fp32', got {precision!r}.")
    counter = OpCounter(region="tail")
    with emulate_cuda(backing="meta") as emulator:
        with torch.device("meta"):
            model = SEDDPerturbationTransformer(
                num_genes=shape.genes, num_bins=shape.bins, hidden_dim=shape.hidden,
                num_layers=shape.layers, num_heads=shape.heads,
                num_perturbations=perturbations,
            )  # fmt: skip
        model = model.to("cuda").eval()
        model.register_forward_pre_hook(lambda *_: setattr(counter, "region", "model"))
        model.register_forward_hook(lambda *_: setattr(counter, "region", "tail"))
        policy = resolve_precision(precision, "cuda")
        sampler = Sampler(
            model, LogLinearNoise(), AbsorbingGraph(shape.bins), precision=policy,
            block_rows=shape.rows,
        )  # fmt: skip
        x = torch.full((shape.rows, shape.genes), shape.bins, device="cuda")  # all masked
        labels = torch.zeros(shape.rows, dtype=torch.long, device="cuda")
        rows = StepRows.of_request(x, 0.8, 0.6, labels=labels)
        branches = StepBranches(any_final=False, kinds=frozenset({"euler"}), any_tempered=False)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with counter.counting(emulator):
            sampler._block_step(rows, branches, True)
        peak = torch.cuda.max_memory_allocated() - base
    result = Roofline(shape, precision, peak_bytes=peak)
    for (region, kind), cost in counter.costs.items():
        part = _IN_MODEL[kind] if region == "model" else "sampler tail"
        result.flops[part] += cost.flops
        result.bytes[part] += cost.bytes
        result.ops[part] += cost.ops
    return result


# H100 SXM peaks, for estimates only: dense bf16 tensor-core FLOP/s and HBM3 bandwidth
H100_BF16_FLOPS = 989e12
H100_BYTES_PER_S = 3.35e12
PLAN_MFU = (0.15, 0.20)  # realistic for these GEMMs and head-size-32 flash attention
PLAN_STEPS = (10, 50)


def estimated_seconds(roofline: Roofline, mfu: float) -> float:
    """An ESTIMATE of one block step on an H100 SXM: each part takes the longer of its FLOPs at
    ``mfu`` of the bf16 peak and its bytes at full HBM bandwidth; the parts run one after
    another (no overlap, no host time: a CUDA graph replays the step)."""
    return sum(
        max(roofline.flops[p] / (mfu * H100_BF16_FLOPS), roofline.bytes[p] / H100_BYTES_PER_S)
        for p in PARTS
    )


def plan_row(name: str, roofline: Roofline, steps: int) -> dict[str, Any]:
    """Estimated cells/s and GPU-hours per million cells at each of ``PLAN_MFU``: a cell takes
    ``steps`` + 1 forwards (the final denoise), in blocks of ``shape.rows`` cells."""
    row: dict[str, Any] = {"model": name, "shape": roofline.shape.label(), "steps": steps,
                           "peak_bytes": roofline.peak_bytes}  # fmt: skip
    for mfu in PLAN_MFU:
        per_cell = (steps + 1) * estimated_seconds(roofline, mfu) / roofline.shape.rows
        row[f"cells_per_s@{mfu:.0%}"] = 1 / per_cell
        row[f"gpu_hours_per_million@{mfu:.0%}"] = per_cell * 1e6 / 3600
    return row


def plan_table(shapes: dict[str, Shape], steps: tuple[int, ...] = PLAN_STEPS) -> list[dict]:
    """The planning table: one bf16 block step counted per shape, estimated at each step count."""
    rows = []
    for name, shape in shapes.items():
        roofline = block_step_roofline(shape, "bf16")
        rows.extend(plan_row(name, roofline, n) for n in steps)
    return rows
