"""``sedd generate``: sample cells from any supported checkpoint into an .h5ad file."""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.commands.args import add_model_arguments, add_output_arguments, add_sampling_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate cells into an .h5ad file (or resumable shards)",
        description="Generate cells with the reverse diffusion sampler. Conditional models "
        "generate --num-cells per condition (default: every condition). With --out-dir, this "
        "process runs one shard (--num-shards/--shard-index, default from the SLURM array) and "
        "`sedd merge DIR --out FILE` joins them.",
    )
    add_model_arguments(p)
    p.add_argument(
        "--num-cells",
        "--cells",
        dest="cells",
        type=int,
        default=10,
        metavar="N",
        help="cells per condition, like HTTP's num_cells (default 10)",
    )
    p.add_argument(
        "--conditions",
        nargs="+",
        metavar="NAME",
        help="condition names: cell types or perturbations (default: every one the model knows)",
    )
    add_sampling_arguments(p)
    add_output_arguments(p, default_out=Path("out/generated.h5ad"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.commands.loading import load_from_args
    from sedd.commands.output import request_from_args, run_request

    loaded = load_from_args(args)
    conditions = args.conditions
    if conditions is None and loaded.conditional:
        conditions = loaded.conditions
    request = request_from_args(args, cells_per_condition=args.cells, conditions=conditions)
    run_request(loaded, request, args)
    return 0
