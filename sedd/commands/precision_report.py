"""``sedd precision-report CKPT``: module dtypes under autocast, bf16 vs fp32 error and speed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sedd.commands.args import add_precision_argument, add_source_options

if TYPE_CHECKING:  # the parser is built for `sedd --help`: the work is imported when it runs
    from rich.console import Console

    from sedd.eval.precision_report import PrecisionReport


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "precision-report",
        help="dtype of every module under autocast, bf16 vs fp32 log-score error and speed",
        description="Load CKPT, run one forward under the precision policy with hooks recording "
        "each module's parameter and output dtypes, measure the log-score error against fp32 "
        "on noised real (--data) or random cells, and time both precisions in this process.",
    )
    p.add_argument("ckpt", metavar="CKPT", help="any supported model source")
    add_source_options(p)
    add_precision_argument(p, "the policy to probe against fp32 (default bf16)", default="bf16")
    p.add_argument("--data", type=Path, help="h5ad of integer counts for clean tokens")
    p.add_argument(
        "--label-key", help="obs column of --data holding perturbation names (else random labels)"
    )
    p.add_argument("--cells", type=int, default=8, help="probe batch size (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="timed forwards per precision")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if any)")
    p.add_argument(
        "--all-modules", action="store_true", help="one row per module (no blocks.* folding)"
    )
    p.add_argument("--out", type=Path, help="also write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sedd.commands.loading import load_source
    from sedd.eval.precision_report import precision_report

    loaded = load_source(args, args.ckpt)
    report = precision_report(
        loaded,
        args.precision,
        cells=args.cells,
        data=args.data,
        label_key=args.label_key,
        repeats=args.repeats,
        seed=args.seed,
        fold=not args.all_modules,
    )
    print_report(report, Console(width=max(Console().width, 120)))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report.as_dict(), indent=2))
        print(f"wrote {args.out}")
    return 0


def print_report(report: PrecisionReport, console: Console) -> None:
    from rich.table import Table

    name = str(report.policy["amp_dtype"])
    console.print(
        f"policy: autocast {name}, weights {report.policy['weight_dtype']}, "
        f"device {report.policy['device']}, TF32 {report.policy['tf32']}, "
        f"torch {report.policy['torch_version']}"
    )
    console.print(
        f"inputs: {report.inputs['source']}, masked fraction {report.inputs['masked_fraction']:.2f}"
    )
    table = Table(title=f"module dtypes under {name} autocast")
    for col in ("module", "class", "params", "outputs", "calls"):
        table.add_column(col, justify="right" if col == "calls" else "left")
    for row in report.modules:
        style = "yellow" if "float32" in row.output_dtypes and name != "fp32" else None
        table.add_row(
            row.name, row.kind, row.param_dtypes, row.output_dtypes, str(row.calls), style=style
        )
    console.print(table)
    err = report.score_error
    kl = f", mean KL(p0) {err['mean_kl_p0']:.2e}" if "mean_kl_p0" in err else ""
    console.print(
        f"log-score error {name} vs fp32 over {int(err['positions'])} positions: max "
        f"{err['max_abs']:.3e}, mean {err['mean_abs']:.3e}, p99 {err['p99_abs']:.3e}{kl}"
    )
    sp = report.speed
    console.print(
        f"speed: {name} {1000 * sp[f'{name}_s_per_forward']:.1f} ms/forward, fp32 "
        f"{1000 * sp['fp32_s_per_forward']:.1f} ms/forward -> {name} / fp32 speed "
        f"{sp['speed_ratio_vs_fp32']:.2f}x (median of {int(sp['repeats'])})"
    )
    for note in report.notes:
        console.print(f"note: {note}")
