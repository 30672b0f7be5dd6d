"""``sedd impute``: sample the genes an .h5ad does not observe, keeping the counts it does."""

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
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--condition",
        metavar="NAME",
        help="condition of every cell (default: each cell's label in the model's training key "
        "when the data has that obs column, else the control)",
    )
    which.add_argument(
        "--condition-key",
        metavar="COLUMN",
        help="obs column giving each cell its own condition (scvi-tools' labels_key)",
    )
    p.add_argument(
        "--cell-type-key",
        metavar="COLUMN",
        help="obs column giving each cell its own cell type (models with cell types; instead "
        "of --cell-type)",
    )
    p.add_argument("--clip", action="store_true", help="clip counts above the model's vocabulary")
    p.add_argument(
        "--n-samples",
        type=int,
        default=1,
        metavar="K",
        help="sample each cell K times (1 to 64) and add the per-cell mean of the K draws as "
        "layers['mean_of_draws'] (float32); .X stays the first draw; draw j of cell i uses "
        "stream (seed, j*N + i) (default 1: no layer)",
    )
    p.add_argument(
        "--expected",
        action="store_true",
        help="add layers['expected_counts'] (float32): each sampled gene's mean count under the "
        "distribution it was drawn from, averaged over the --n-samples draws (less noise than "
        "their mean); observed genes keep their count, the cells do not change",
    )
    add_model_arguments(p)
    add_sampling_arguments(p)
    add_output_arguments(p, default_out=Path("out/imputed.h5ad"), shards=False)
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sedd.commands.loading import load_from_args
    from sedd.commands.output import check_h5ad_name, request_from_args, run_request
    from sedd.io.files import check_writable, refuse_existing
    from sedd.io.hdf5_safety import check_self_contained
    from sedd.request.draws import check_n_samples
    from sedd.request.imputation import (
        dropped_genes_warning,
        imputation_conditions,
        imputation_from_anndata,
        with_cell_types,
    )

    check_n_samples(args.n_samples)  # before the data is read or the model loads
    data = args.data or args.input
    if not data.is_file():
        raise FileNotFoundError(f"--data {data} is not a file; pass an .h5ad of counts.")
    check_h5ad_name(args.out)
    check_self_contained(data, "--data")  # before the model loads (read_counts checks again)
    refuse_existing(args.out or args.default_out, overwrite=args.overwrite)
    check_writable(args.out or args.default_out)  # before the work, not after it
    loaded = load_from_args(args)
    if args.cell_type is not None and args.cell_type_key is not None:
        raise ValueError("pass --cell-type (one for all) or --cell-type-key (per cell), not both.")
    imputation = imputation_from_anndata(loaded, data, layer=args.layer, clip=args.clip)
    imputation = with_cell_types(loaded, imputation, cell_type_key=args.cell_type_key)
    dropped_genes_warning(imputation)
    conditions, counts = imputation_conditions(
        loaded, imputation, args.condition, args.condition_key
    )
    request = request_from_args(
        args,
        schedule=loaded.schedule,
        cells_per_condition=imputation.num_cells if counts is None else 1,
        conditions=conditions,
        imputation=imputation,
        condition_counts=counts,
        n_samples=args.n_samples,
        expected=args.expected,
    )
    run_request(loaded, request, args)
    return 0
