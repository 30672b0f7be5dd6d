"""``sedd impute``: sample the genes an .h5ad does not observe, keeping the counts it does."""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.commands.args import add_model_arguments, add_sampling_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "impute",
        help="impute the unobserved genes of cells in an .h5ad",
        description="Read integer counts of some genes of some cells (.X or --layer), match the "
        "genes to the model's by name (genes the model lacks are reported and dropped), sample "
        "every other gene and write all of the model's genes, the given counts kept.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", type=Path, metavar="FILE", help=".h5ad with integer counts")
    where.add_argument("input", type=Path, nargs="?", metavar="INPUT", help="the same as --data")
    p.add_argument("--layer", help="read counts from this layer instead of .X")
    p.add_argument(
        "--condition", metavar="NAME", help="condition of every cell (default: the control)"
    )
    p.add_argument("--clip", action="store_true", help="clip counts above the model's vocabulary")
    p.add_argument("--out", type=Path, default=Path("out/imputed.h5ad"), help="output .h5ad")
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.api import Model
    from sedd.commands.loading import load_from_args
    from sedd.commands.output import finish
    from sedd.io.files import check_writable
    from sedd.io.write import write_h5ad_atomic
    from sedd.precision import resolve_precision

    data = args.data or args.input
    if not data.is_file():
        raise FileNotFoundError(f"--data {data} is not a file; pass an .h5ad of counts.")
    check_writable(args.out)  # before the work, not after it
    loaded = load_from_args(args)
    model = Model(loaded, resolve_precision(args.precision, loaded.device))
    steps = {"steps": args.steps, "time_grid": args.time_grid}
    adata = model.impute(
        data, layer=args.layer, condition=args.condition, cell_type=args.cell_type,
        sampler=args.sampler, temperature=args.temperature, seed=args.seed,
        batch_size=args.batch_size, clip=args.clip, progress=True, **steps,
    )  # fmt: skip
    write_h5ad_atomic(adata, args.out)
    stats = dict(adata.uns["sedd"]["timings"])
    finish(args.out, stats, model.policy, num_genes=adata.n_vars)
    return 0
