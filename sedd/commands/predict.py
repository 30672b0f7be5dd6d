"""``sedd predict``: cells for named perturbations (control cells included) into an .h5ad file.

One file with ``--out``, or, with ``--out-dir``, one resumable shard of the request (shard count
and index default to the SLURM job array); ``sedd merge DIR --out FILE`` joins the shards.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.commands.args import (
    add_model_arguments,
    add_output_arguments,
    add_progress_argument,
    add_sampling_arguments,
)
from sedd.defaults import CELLS_PER_PERTURBATION


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="predict cells under named perturbations (control included)",
        description="Generate --cells-per-perturbation cells for each perturbation (by name or "
        "from a file, one name a line; default: every label the model knows), plus the same "
        "number of control cells (the model's control label) unless --no-control.",
    )
    add_model_arguments(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--perturbations", nargs="+", metavar="NAME", help="perturbation names")
    which.add_argument(
        "--perturbations-file", type=Path, metavar="FILE", help="perturbation names, one a line"
    )
    p.add_argument(
        "--cells-per-perturbation",
        type=int,
        default=CELLS_PER_PERTURBATION,
        metavar="N",
        help="cells per perturbation, control included (default "
        f"{CELLS_PER_PERTURBATION}, st3's; as Model.predict and HTTP /predict)",
    )
    p.add_argument("--no-control", action="store_true", help="generate no control cells")
    p.add_argument(
        "--control-label", metavar="NAME", help="the control (default: the model's control label)"
    )
    add_sampling_arguments(p)
    add_output_arguments(p, default_out=Path("out/predicted.h5ad"))
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.commands.loading import load_from_args
    from sedd.commands.output import check_h5ad_name, request_from_args, run_request
    from sedd.request.conditions import perturbation_conditions, read_perturbation_file

    check_h5ad_name(args.out)  # before the model loads
    names = args.perturbations
    if args.perturbations_file is not None:
        names = read_perturbation_file(args.perturbations_file)
    loaded = load_from_args(args)
    conditions = perturbation_conditions(
        loaded, names, include_control=not args.no_control, control=args.control_label
    )
    request = request_from_args(
        args,
        cells_per_condition=args.cells_per_perturbation,
        conditions=conditions,
        schedule=loaded.schedule,
    )
    run_request(loaded, request, args)
    return 0
