"""``sedd generate``: sample cells from any supported checkpoint into an .h5ad file."""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.commands.args import (
    add_model_arguments,
    add_output_arguments,
    add_progress_argument,
    add_sampling_arguments,
)


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
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--conditions",
        nargs="+",
        metavar="NAME",
        help="condition names: cell types or perturbations (default: every one the model knows)",
    )
    which.add_argument(
        "--like",
        type=Path,
        metavar="FILE",
        help="an .h5ad whose label mix to copy: as many cells of each label as it has "
        "(instead of --num-cells per condition)",
    )
    p.add_argument(
        "--condition-key",
        metavar="COLUMN",
        help="with --like: the obs column of labels (default: the model's training key)",
    )
    add_sampling_arguments(p)
    add_output_arguments(p, default_out=Path("out/generated.h5ad"))
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.commands.loading import load_from_args
    from sedd.commands.output import check_h5ad_name, request_from_args, run_request
    from sedd.request.conditions import label_mix

    check_h5ad_name(args.out)  # before the model loads
    if args.condition_key is not None and args.like is None:
        raise ValueError("--condition-key names the label column of --like FILE; pass --like.")
    loaded = load_from_args(args)
    if args.like is not None:
        names, counts = label_mix(loaded, args.like, args.condition_key)
        request = request_from_args(
            args,
            cells_per_condition=1,
            conditions=names,
            condition_counts=tuple(counts),
            schedule=loaded.schedule,
        )
        run_request(loaded, request, args)
        return 0
    conditions = args.conditions
    if conditions is None and loaded.conditional:
        conditions = loaded.conditions
    request = request_from_args(
        args, cells_per_condition=args.cells, conditions=conditions, schedule=loaded.schedule
    )
    run_request(loaded, request, args)
    return 0
