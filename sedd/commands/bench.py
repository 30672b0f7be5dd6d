"""``sedd bench``: fp32 vs bf16 sampling throughput and memory side by side; ``--compare``:
st3's sampling pattern against our default on a real model, with quality and MFU;
``--overhead``: host work, aten ops and host syncs per engine step at several rows in flight."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sedd.commands.args import add_cuda_graphs_argument, add_precision_argument
from sedd.commands.roofline import add_arguments as add_roofline_arguments

if TYPE_CHECKING:  # the parser is built for `sedd --help`: the work is imported when it runs
    from rich.table import Table


def _shape(text: str) -> tuple[int, int, int]:
    try:
        hidden, layers, heads = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shapes entries are HIDDEN/LAYERS/HEADS such as 128/4/4, got {text!r}"
        ) from None
    return hidden, layers, heads


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark sampling in fp32 and bf16 side by side",
        description="Sample random-weight st3 transformers under each precision in one process "
        "and print cells/s, tokens/s, ms/forward, peak memory and ratios vs fp32.",
    )
    p.add_argument(
        "--shapes",
        type=_shape,
        nargs="+",
        default=[(128, 4, 4), (256, 8, 8)],
        help="model shapes HIDDEN/LAYERS/HEADS (default: 128/4/4 256/8/8)",
    )
    p.add_argument(
        "--num-genes",
        type=int,
        nargs="+",
        default=None,
        help="genes per cell (default: 1000 on CPU, 8563 on CUDA)",
    )
    p.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="cells per batch (default: 8 on CPU, 64 on CUDA)",
    )
    p.add_argument("--steps", type=int, default=8, help="sampling steps (+1 final denoise)")
    p.add_argument("--num-bins", type=int, default=64, help="count tokens (vocab = bins + 1)")
    p.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32", "bf16"],
        choices=["fp32", "bf16", "fp16"],
        help="fp32 is the baseline",
    )
    p.add_argument("--repeats", type=int, default=2, help="timed runs per precision (median)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if any)")
    c = p.add_argument_group("--compare: st3's pattern against our default on a real model")
    c.add_argument(
        "--compare",
        action="store_true",
        help="sedd generate --steps 50 --batch-size 1 against plain sedd generate, alternating: "
        "cells/s, quality against held-out cells, their ratio, and MFU",
    )
    c.add_argument("--model", default=None, help="model to compare on (default: the bundled)")
    c.add_argument(
        "--data",
        type=Path,
        default=None,
        help="labelled counts with a split column (train/test) in the model's genes "
        "(default: the bundled PBMC counts)",
    )
    add_precision_argument(c, "autocast dtype of both arms (auto: bf16 where it is native)")
    c.add_argument("--seed", type=int, default=0, help="chunk k uses seed * 1000 + k")
    c.add_argument("--chunks", type=int, default=5, help="alternations of the two arms")
    o = p.add_argument_group("--overhead: host work per engine step, rows in flight in one block")
    o.add_argument(
        "--overhead",
        action="store_true",
        help="per step at each --rows: tick ms, host ms (outside the forward; on CUDA the "
        "host's own work), forward or device ms, aten ops, host syncs (a small random model, "
        "or --model)",
    )
    o.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256], help="rows in flight")
    o.add_argument("--ticks", type=int, default=5, help="timed steps per row count")
    add_cuda_graphs_argument(o)
    add_roofline_arguments(p)
    p.add_argument(
        "--out", type=Path, default=Path("bench_results/bench.json"), help="JSON results file"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from sedd.bench import BenchCase, environment, run_case
    from sedd.commands.loading import resolve_device

    if args.roofline:  # on the emulated lane's meta backing: any machine, no device needed
        from sedd.commands.roofline import run_roofline

        return run_roofline(args)
    args.device = resolve_device(args.device)
    if args.compare:
        return _run_compare(args)
    if args.overhead:
        return _run_overhead(args)
    for name in ("steps", "repeats", "num_bins"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    gene_counts = args.num_genes or [8563 if on_cuda else 1000]
    batch_sizes = args.batch_sizes or [64 if on_cuda else 8]
    if min(gene_counts) < 1 or min(batch_sizes) < 1:
        raise ValueError(
            f"--num-genes and --batch-sizes must be >= 1, got {gene_counts} and {batch_sizes}."
        )
    precisions = list(dict.fromkeys(["fp32", *args.precisions]))
    console = Console(width=max(Console().width, 180))
    console.print(f"sedd bench on {device}: {environment()}")
    entries = []
    for (hidden, layers, heads), genes, batch in itertools.product(
        args.shapes, gene_counts, batch_sizes
    ):
        case = BenchCase(hidden, layers, heads, genes, batch, args.steps)
        console.print(f"running {case.label}, {args.steps} steps ...")
        entries.append(run_case(case, device, precisions, args.num_bins, args.repeats))
    console.print(_table(entries))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"environment": environment(), "device": str(device), "cases": entries}, indent=2
        )
    )
    console.print(f"wrote {args.out}")
    return 0


def _table(entries: list[dict]) -> Table:
    from rich.table import Table

    table = Table(title="sampling throughput (median of repeats)")
    for col in (
        "model H/L/heads",
        "genes",
        "batch",
        "precision",
        "cells/s",
        "tokens/s",
        "ms/forward",
        "fwd/cell",
        "genes/fwd",
        "peak MiB",
        "speedup vs fp32",
        "mem vs fp32",
        "max|dlogp|",
    ):
        table.add_column(col, justify="right")
    for entry in entries:
        case = entry["case"]
        for name, r in entry["results"].items():
            ratio = entry.get("ratios_vs_fp32", {}).get(name)
            parity = entry.get("score_parity_vs_fp32", {}).get(name)
            table.add_row(
                f"{case['hidden']}/{case['layers']}/{case['heads']}",
                str(case["genes"]),
                str(case["batch"]),
                name,
                f"{r['cells_per_s']:.2f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['ms_per_forward']:.1f}",
                f"{r['forwards_per_cell']:.2f}",
                f"{r['genes_per_forward']:.1f}",
                f"{r['peak_mib']:.0f}",
                f"{ratio['speedup_cells_per_s']:.2f}x" if ratio else "1.00x",
                f"{ratio['peak_memory']:.2f}x" if ratio else "1.00x",
                f"{parity['max_abs']:.3g}" if parity else "-",
            )
    return table


def _run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sedd.api import load
    from sedd.bench import environment
    from sedd.bench.compare import compare, mfu
    from sedd.defaults import BUNDLED_DATA

    if args.chunks < 1 or args.seed < 0:
        raise ValueError(f"--chunks must be >= 1 and --seed >= 0, got {args.chunks}, {args.seed}.")
    model = load(args.model, device=args.device, precision=args.precision)
    loaded, policy = model.loaded, model.policy
    console = Console(width=max(Console().width, 180))
    console.print(f"sedd bench --compare on {args.device} ({policy.name}): {environment()}")
    console.print("st3's pattern and our default, alternating chunks ...")
    data = args.data or BUNDLED_DATA
    result = compare(loaded, policy, data, seed=args.seed, chunks=args.chunks)
    console.print("MFU of one forward of the default's row block ...")
    result["mfu"] = mfu(loaded, policy)
    result["environment"] = {**environment(), "precision": policy.name}
    console.print(_compare_table(result))
    for line in _mfu_lines(result["mfu"]):
        console.print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.with_name("compare.json") if args.out.name == "bench.json" else args.out
    out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {out}")
    return 0


def _run_overhead(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from sedd.bench import environment
    from sedd.bench.overhead import measure, small_model
    from sedd.precision import resolve_precision

    if min(args.rows) < 1 or args.ticks < 1:
        raise ValueError(f"--rows and --ticks must be >= 1, got {args.rows} and {args.ticks}.")
    labels = None
    if args.model is None:
        model, noise, graph = small_model(device=args.device)
        genes, name = 64, "small random st3 model (64 genes, 64 hidden, 2 layers, 4 heads)"
    else:
        from sedd.api import load

        loaded = load(args.model, device=args.device, precision=args.precision).loaded
        model, noise, graph = loaded.model, loaded.noise, loaded.graph
        genes, name = loaded.config.num_genes, str(args.model)
        if loaded.config.num_perturbations:
            labels = torch.zeros(1, dtype=torch.long)
    policy = resolve_precision(args.precision, args.device)
    console = Console(width=max(Console().width, 120))
    console.print(f"sedd bench --overhead on {args.device} ({policy.name}), {name}: "
                  f"{environment()}")  # fmt: skip
    figures = measure(model, noise, graph, policy, genes, args.rows, ticks=args.ticks,
                      labels=labels, cuda_graphs=bool(args.cuda_graphs))  # fmt: skip
    table = Table(title=f"per engine step, every row in one block of {max(args.rows)} rows")
    timed = ["host ms outside forward", "forward ms"]
    if torch.device(args.device).type == "cuda":  # the host and the device timed apart
        timed = ["host ms (host clock, less the readback wait)", "device ms (CUDA events)"]
    for col in ("rows in flight", "tick ms", *timed, "aten ops", "syncs"):
        table.add_column(col, justify="right")
    for f in figures:
        table.add_row(str(f.rows), f"{f.tick_ms:.2f}", f"{f.host_ms:.2f}", f"{f.forward_ms:.2f}",
                      f"{f.aten_ops:.0f}", f"{f.syncs:.0f}")  # fmt: skip
    console.print(table)
    out = args.out.with_name("overhead.json") if args.out.name == "bench.json" else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"environment": {**environment(), "precision": policy.name}, "model": name,
              "cuda_graphs": bool(args.cuda_graphs),
              "device": str(args.device), "figures": [f.as_dict() for f in figures]}  # fmt: skip
    out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {out}")
    return 0


def _compare_table(result: dict) -> Table:
    from rich.table import Table

    table = Table(title=f"st3's pattern vs our default, {result['cells']} cells each")
    quality = ("corr_rms", "mmd2_rbf", "energy_distance", "within_label_agreement")
    columns = ("arm", "sampler", "steps", "batch", "seconds", "cells/s", "model calls",
               "forwards a cell", *quality)  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for name in ("st3", "default"):
        arm = result[name]
        adaptive = arm["sampler"] == "entropy"
        how = f" (bound {arm['entropy_bound']:g})" if adaptive else f", {arm['time_grid']}"
        sampler = arm["sampler"] + how
        table.add_row(
            name, sampler, str(arm["steps"]), str(arm["batch_size"]),
            f"{arm['seconds']:.1f}", f"{arm['cells_per_s']:.3f}", str(arm["model_calls"]),
            f"{arm['forwards_per_cell']:.2f}", *(f"{arm['quality'][q]:.4f}" for q in quality),
        )  # fmt: skip
    table.caption = (
        f"default / st3 cells/s: {result['speedup_cells_per_s']:.2f}x; within-label agreement "
        f"of the {result['cells']} held-out cells: {result['held_out_within_label_agreement']:.4f}"
    )
    return table


def _mfu_lines(figures: dict) -> list[str]:
    lines = [
        f"MFU at {figures['rows']} row(s) a forward, {figures['flops_per_forward'] / 1e9:.3f} "
        f"GFLOP a forward (attention counted); fp32 2048^2 matmul "
        f"{figures['fp32_matmul'] / 1e9:.1f} GFLOP/s"
    ]
    for name, entry in figures.items():
        if not isinstance(entry, dict):
            continue
        own = entry.get(f"mfu_vs_{name}_matmul") if name != "fp32" else None
        extra = "" if own is None else f", {own:.2f} of a {name} matmul"
        lines.append(
            f"  {name}: {entry['ms_per_forward']:.1f} ms a forward, "
            f"{entry['flops_per_s'] / 1e9:.1f} GFLOP/s, MFU {entry['mfu_vs_fp32_matmul']:.2f} "
            f"of the fp32 matmul{extra}"
        )
    return lines
