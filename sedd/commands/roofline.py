"""``sedd bench --roofline``: FLOPs, bytes and peak memory of one block step by part, counted on
the emulated CUDA lane's ``meta`` backing (``sedd.bench.roofline``); with ``--plan`` an ESTIMATED
H100 planning table. Nothing here is a GPU measurement."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parser is built for `sedd --help`: torch is imported when it runs
    from sedd.bench.roofline import Shape

SHAPES = {  # name -> GENESxBINS:HIDDEN/LAYERS/HEADS (rows: the CUDA default block)
    "bundled": "765x260:128/4/4",
    "K562": "8563x1724:256/8/8",
    "28k genes": "28000x1724:256/8/8",
}
_FORM = "GENESxBINS:HIDDEN/LAYERS/HEADS[:ROWS]"


def parse_shape(text: str) -> Shape:
    """``GENESxBINS:HIDDEN/LAYERS/HEADS[:ROWS]`` -> ``Shape``; rows left out: the block the
    engine runs on CUDA (``DEFAULT_TOKENS_PER_FORWARD["cuda"]`` tokens // genes)."""
    from sedd.bench.roofline import Shape
    from sedd.engine.forwards import block_rows_for

    try:
        sizes, arch, *rows = text.split(":")
        genes, bins = (int(v) for v in sizes.split("x"))
        hidden, layers, heads = (int(v) for v in arch.split("/"))
        if len(rows) > 1:
            raise ValueError
        block = int(rows[0]) if rows else block_rows_for(max(genes, 1), "cuda")
    except ValueError:
        raise ValueError(
            f"--roofline-shape must be {_FORM} (e.g. {SHAPES['K562']}:15), got {text!r}."
        ) from None
    shape = Shape(genes, bins, hidden, layers, heads, block)
    if min(genes, bins, hidden, layers, heads, block) < 1:
        raise ValueError(f"--roofline-shape sizes must be >= 1, got {text!r}.")
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(f"--roofline-shape HIDDEN must split into even HEADS, got {text!r}.")
    return shape


def add_arguments(parser: argparse.ArgumentParser) -> None:
    r = parser.add_argument_group("--roofline: one block step's FLOPs, bytes and memory by part")
    r.add_argument("--roofline", action="store_true",
                   help="per part (attention, linear, element-wise, sampler tail) of one block "
                   "step, counted on the emulated lane's meta backing; no GPU needed")  # fmt: skip
    r.add_argument("--roofline-shape", default=SHAPES["K562"], metavar=_FORM,
                   help=f"model and block shape (default K562: {SHAPES['K562']}, rows from the "
                   "CUDA default of 131,072 tokens a forward: 15)")  # fmt: skip
    r.add_argument("--plan", action="store_true",
                   help="also an ESTIMATED H100 table: cells/s and GPU-hours per million cells "
                   "for the bundled, K562 and 28k-gene shapes at 10 and 50 steps")  # fmt: skip


def run_roofline(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sedd.bench.roofline import PARTS, block_step_roofline

    shape = parse_shape(args.roofline_shape)
    precision = {"auto": "bf16", "bf16": "bf16", "fp32": "fp32"}.get(args.precision)
    if precision is None:
        raise ValueError(f"--roofline counts bf16 or fp32 (or auto), got {args.precision!r}.")
    result = block_step_roofline(shape, precision)  # type: ignore[arg-type]
    console = Console(width=max(Console().width, 110))
    table = Table(title=f"one block step, {shape.label()} ({precision}), emulated CUDA on meta: "
                  "counted, not timed")  # fmt: skip
    for col in ("part", "GFLOP", "GB moved", "FLOP/byte", "ops"):
        table.add_column(col, justify="right")
    rows = [(p, result.flops[p], result.bytes[p], result.ops[p]) for p in PARTS]
    rows.append(("total", result.total_flops, result.total_bytes, sum(result.ops.values())))
    for part, flops, moved, ops in rows:
        intensity = f"{flops / moved:.1f}" if moved else "-"
        table.add_row(part, f"{flops / 1e9:,.1f}", f"{moved / 1e9:,.2f}", intensity, str(ops))
    console.print(table)
    console.print(f"peak device memory of the step: {result.peak_bytes / 2**30:.2f} GiB")
    out: dict = {"roofline": result.as_dict()}
    if args.plan:
        out["plan_estimate"] = _print_plan(console)
    target = args.out.with_name("roofline.json") if args.out.name == "bench.json" else args.out
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2))
    console.print(f"wrote {target}")
    return 0


def _print_plan(console: object) -> list[dict]:
    from rich.table import Table

    from sedd.bench.roofline import PLAN_MFU, plan_table

    rows = plan_table({name: parse_shape(text) for name, text in SHAPES.items()})
    low, high = (f"{m:.0%}" for m in PLAN_MFU)
    plan = Table(
        title=f"ESTIMATE, not measured: one H100 SXM (989 TFLOP/s bf16, 3.35 TB/s), "
        f"GEMMs and attention at {low}-{high} MFU, other parts' bytes at full bandwidth"
    )
    heads = ("model", "shape", "steps", f"cells/s ({low}-{high})", "GPU-h / 1M cells", "peak GiB")
    for col in heads:
        plan.add_column(col, justify="right")
    for row in rows:
        cells = f"{row[f'cells_per_s@{low}']:,.1f}-{row[f'cells_per_s@{high}']:,.1f}"
        hours = f"{row[f'gpu_hours_per_million@{high}']:,.2f}-"
        hours += f"{row[f'gpu_hours_per_million@{low}']:,.2f}"
        peak = f"{row['peak_bytes'] / 2**30:.1f}"
        plan.add_row(row["model"], row["shape"], str(row["steps"]), cells, hours, peak)
    console.print(plan)  # type: ignore[attr-defined]
    return rows
