"""``sedd bench --roofline``: FLOPs, bytes and peak memory of one block step by part, from the
emulated CUDA lane on ``meta`` (``sedd.bench.roofline``), and with ``--plan`` an ESTIMATED H100
planning table. Nothing here is a GPU measurement."""

from __future__ import annotations

import argparse
import json

SHAPES = {  # name -> GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS (rows: the CUDA default block)
    "bundled": "765x260:128/4/4:171",
    "K562": "8563x1724:256/8/8:15",
    "28k genes": "28000x1724:256/8/8:4",
}


def parse_shape(text: str) -> object:
    """``GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS`` (e.g. ``8563x1724:256/8/8:15``) -> ``Shape``."""
    from sedd.bench.roofline import Shape

    try:
        sizes, arch, rows = text.split(":")
        genes, bins = (int(v) for v in sizes.split("x"))
        hidden, layers, heads = (int(v) for v in arch.split("/"))
        shape = Shape(genes, bins, hidden, layers, heads, int(rows))
    except ValueError:
        raise ValueError(
            f"--roofline-shape must be GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS "
            f"(e.g. {SHAPES['K562']}), got {text!r}."
        ) from None
    if min(shape.genes, shape.bins, shape.hidden, shape.layers, shape.heads, shape.rows) < 1:
        raise ValueError(f"--roofline-shape sizes must be >= 1, got {text!r}.")
    return shape


def add_arguments(parser: argparse.ArgumentParser) -> None:
    r = parser.add_argument_group("--roofline: one block step's FLOPs, bytes and memory by part")
    r.add_argument("--roofline", action="store_true",
                   help="per part (attention, linear, element-wise, sampler tail) of one block "
                   "step on the emulated lane's meta backing; no GPU needed")  # fmt: skip
    r.add_argument("--roofline-shape", default=SHAPES["K562"],
                   help=f"GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS (default K562: {SHAPES['K562']})")
    r.add_argument("--plan", action="store_true",
                   help="also an ESTIMATED H100 table: cells/s and GPU-hours per million cells "
                   "for the bundled, K562 and 28k-gene shapes at 10 and 50 steps")  # fmt: skip


def run_roofline(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sedd.bench.roofline import PARTS, block_step_roofline, plan_table

    shape = parse_shape(args.roofline_shape)
    precision = "bf16" if args.precision in ("auto", "bf16") else args.precision
    result = block_step_roofline(shape, precision)  # type: ignore[arg-type]
    console = Console(width=max(Console().width, 110))
    table = Table(title=f"one block step, {args.roofline_shape} ({precision}), emulated CUDA on "
                  "meta: counted, not timed")  # fmt: skip
    for col in ("part", "GFLOP", "GB moved", "FLOP/byte", "ops"):
        table.add_column(col, justify="right")
    for part in PARTS:
        flops, moved = result.flops[part], result.bytes[part]
        intensity = f"{flops / moved:.1f}" if moved else "-"
        table.add_row(part, f"{flops / 1e9:.1f}", f"{moved / 1e9:.2f}", intensity,
                      str(result.ops[part]))  # fmt: skip
    total_f, total_b = sum(result.flops.values()), sum(result.bytes.values())
    table.add_row("total", f"{total_f / 1e9:.1f}", f"{total_b / 1e9:.2f}",
                  f"{total_f / total_b:.1f}", str(sum(result.ops.values())))  # fmt: skip
    console.print(table)
    console.print(f"peak device memory of the step: {result.peak_bytes / 2**30:.2f} GiB")
    out = {"roofline": result.as_dict()}
    if args.plan:
        from sedd.bench.roofline import Shape

        shapes = {name: parse_shape(text) for name, text in SHAPES.items()}
        rows = plan_table({k: v for k, v in shapes.items() if isinstance(v, Shape)})
        plan = Table(title="ESTIMATE, not measured: one H100 SXM (989 TFLOP/s bf16, 3.35 TB/s), "
                     "GEMMs and attention at 15-20% MFU, element-wise bytes at full bandwidth")
        for col in ("model", "steps", "MFU", "cells/s", "GPU-hours / 1M cells"):
            plan.add_column(col, justify="right")
        for row in rows:
            plan.add_row(row["model"], str(row["steps"]), f"{row['mfu']:.0%}",
                         f"{row['cells_per_s']:.1f}", f"{row['gpu_hours_per_million']:.1f}")
        console.print(plan)
        out["plan_estimate"] = rows
    target = args.out.with_name("roofline.json") if args.out.name == "bench.json" else args.out
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {target}")
    return 0
