"""``sedd quality``: a quality report of a model against labelled held-out cells.

The model generates ``--seeds`` sets in the held-out cells' label mix (``Model.generate(like=)``,
as ``sedd generate --like``); ``sedd.eval.quality_report`` scores each set against the held-out
cells at equal numbers of cells; this prints the tables and writes ``quality.json`` and the
plots. A perturbation model gets the perturbation report instead
(``sedd.commands.quality_perturbation``). It needs the ``quality`` extra (scanpy, igraph,
umap-learn), checked before anything loads.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from sedd.commands.args import (
    add_model_arguments,
    add_option_argument,
    add_precision_argument,
    add_progress_argument,
)
from sedd.defaults import BUNDLED_DATA, OPTION_NAMES, SCHEDULE_FIELDS, SamplingOptions

if TYPE_CHECKING:
    import anndata
    import numpy as np

    from sedd.eval.quality_report import LabelledCounts

# (module imported, distribution to install) of the quality extra beyond the base dependencies
QUALITY_EXTRA = (("scanpy", "scanpy"), ("igraph", "igraph"), ("umap", "umap-learn"))
EXIT_MISSING_EXTRA = 2  # as sedd.cli's EXIT_INPUT: the command cannot run as asked


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "quality",
        help="a quality report of a model against labelled held-out cells",
        description="Generate --seeds sets of cells in the held-out cells' label mix and report, "
        "in a PCA fitted on the training cells: per-label sub-population recovery (Leiden on "
        "real and generated cells together), within-label correlation agreement, label kNN "
        "accuracy, energy distance and MMD^2 against the real noise floor, a memorisation guard "
        "and marker-gene scores; each seed's set is scored alone, beside the held-out cells at "
        "the same size. Prints tables, writes quality.json and PNG plots to --out. A "
        "perturbation model (one with a control label) gets the perturbation report of sedd "
        "evaluate --perturbation --model instead, on --real's held-out cells. Needs pip install "
        "-e '.[quality]'.",
    )
    add_model_arguments(p)
    p.add_argument(
        "--real",
        type=Path,
        default=BUNDLED_DATA,
        metavar="FILE",
        help="labelled real counts (.h5ad) with a train/test split column",
    )
    p.add_argument("--split-key", default="split", metavar="COLUMN", help="obs column of the split")
    p.add_argument("--train-value", default="train", help="--split-key value of training cells")
    p.add_argument("--test-value", default="test", help="--split-key value of held-out cells")
    p.add_argument(
        "--condition-key",
        default=None,
        metavar="COLUMN",
        help="obs column of the labels the model is conditioned on (default: the model's "
        "label_key, else bulk_labels)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=5,
        metavar="N",
        help="generated sets, seeds 0..N-1, each in the label mix of the held-out cells used",
    )
    for option in fields(SamplingOptions):  # the sets' seeds are 0..N-1 (--seeds)
        if option.name != "seed":
            add_option_argument(p, option)
    p.add_argument(
        "--max-cells",
        type=int,
        default=None,
        metavar="N",
        help="use a random N of the held-out cells (seeded; default: all)",
    )
    p.add_argument(
        "--markers",
        action="append",
        metavar="LABEL=G1,G2,...",
        help="a label and the genes of one of its sub-populations, repeatable "
        "(default: CD19+ B=MZB1,IGJ,TNFRSF17,FKBP11,SSR4,IGLL5 when they exist)",
    )
    p.add_argument("--resolution", type=float, default=1.0, help="Leiden resolution")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random state of the PCA, clustering, UMAP and --max-cells subset",
    )
    add_precision_argument(p, "autocast dtype of the model forward")
    p.add_argument("--batch-size", type=int, default=64, help="cells in flight at once")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if any)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out/quality"),
        metavar="DIR",
        help="directory for quality.json and the plots",
    )
    add_progress_argument(p)
    p.set_defaults(func=run)


def missing_extra() -> list[str]:
    """The quality extra's distributions that are not installed (found without importing)."""
    return [name for module, name in QUALITY_EXTRA if importlib.util.find_spec(module) is None]


def run(args: argparse.Namespace) -> int:
    if missing := missing_extra():
        print(
            "sedd quality: error: needs scanpy, igraph and umap-learn (not installed: "
            f"{', '.join(missing)}): pip install -e '.[quality]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    import numpy as np
    from rich.console import Console

    from sedd.api import Model
    from sedd.commands.args import show_progress
    from sedd.commands.loading import load_from_args
    from sedd.commands.quality_tables import report_tables
    from sedd.eval.markers import default_marker_sets
    from sedd.eval.quality_plots import write_quality_plots
    from sedd.eval.quality_report import quality_report
    from sedd.precision import resolve_precision

    for flag, value in (("--seeds", args.seeds), ("--max-cells", args.max_cells)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}.")
    requested = parse_marker_sets(args.markers or [])
    real = _read_real(args.real)
    loaded = load_from_args(args)  # as sedd generate loads --model and its side files
    model = Model(loaded, resolve_precision(args.precision, loaded.device))
    if model.control is not None:
        from sedd.commands.quality_perturbation import run_perturbation_report

        return run_perturbation_report(args, _defaults(), model, real)
    args.condition_key = args.condition_key or loaded.config.label_key or "bulk_labels"
    _check_key(real, args.real, args.condition_key)
    train_cells = _split(real, args, args.train_value)
    test_cells = _split(real, args, args.test_value)
    if args.max_cells is not None and args.max_cells < test_cells.n_obs:
        test_cells = _subset(test_cells, args.max_cells, args.seed)
    console = Console(width=max(Console().width, 160))
    genes = model.genes
    labels = sorted(set(real.obs[args.condition_key].dropna().astype(str)))
    markers = check_marker_sets(requested, labels, genes) or default_marker_sets(labels, genes)
    train, test = _labelled(train_cells, genes, args), _labelled(test_cells, genes, args)

    console.print(
        f"generating {args.seeds} set(s) of {test_cells.n_obs} cells in the held-out "
        f"label mix with {model} ..."
    )
    started = time.perf_counter()
    sets = [
        model.generate(
            like=test_cells,
            condition_key=args.condition_key,
            **{name: getattr(args, name) for name in OPTION_NAMES if name != "seed"},
            seed=seed,
            batch_size=args.batch_size,
            progress=show_progress(args.progress),
        )
        for seed in range(args.seeds)
    ]
    generating = time.perf_counter() - started
    generated, gen_seeds = _generated_counts(sets)
    started = time.perf_counter()
    report, arrays = quality_report(
        genes,
        train,
        test,
        generated,
        gen_seeds,
        marker_sets=markers,
        seed=args.seed,
        resolution=args.resolution,
    )
    inputs = {
        "model": str(model.loaded.path),
        "real": str(args.real),
        "split": {"key": args.split_key, "train": args.train_value, "test": args.test_value},
        "condition_key": args.condition_key,
        "seeds": list(range(args.seeds)),
        "steps": sets[0].uns["sedd"]["steps"],
        "sampling": {
            key: sets[0].uns["sedd"]["request"][key]
            for key in SCHEDULE_FIELDS
            if key in sets[0].uns["sedd"]["request"]
        },
        # what a cell cost, over every set
        "forwards_per_cell": float(
            np.mean([s.uns["sedd"]["timings"]["forwards_per_cell"] for s in sets])
        ),
        "genes_per_forward": float(
            np.mean([s.uns["sedd"]["timings"]["genes_per_forward"] for s in sets])
        ),
        "precision": model.policy.name,
        "cells": {
            "train": train_cells.n_obs,
            "held_out": test_cells.n_obs,
            "generated": len(gen_seeds),
            "generated_per_seed": [s.n_obs for s in sets],
        },
        "seconds": {"generating": generating, "report": time.perf_counter() - started},
    }
    # the inputs' scale, as the cells files' uns["sedd"]["scale"]: real and generated cells are
    # raw counts; the figures are on their log1p-CP10k values (PCs, correlations, markers)
    result = {"scale": "counts", "inputs": inputs, **report}
    for table in report_tables(result):
        console.print(table)
    console.print(f"memorisation guard: {report['memorisation']['verdict']}", highlight=False)
    args.out.mkdir(parents=True, exist_ok=True)
    result["plots"] = [p.name for p in write_quality_plots(arrays, markers, args.out)]
    (args.out / "quality.json").write_text(json.dumps(result, indent=2))
    for name in ["quality.json", *result["plots"]]:
        console.print(f"wrote {args.out / name}")
    return 0


def parse_marker_sets(specs: Sequence[str]) -> dict[str, list[str]]:
    """``["LABEL=G1,G2", ...]`` -> ``{LABEL: [G1, G2]}`` (syntax only; see check_marker_sets)."""
    sets: dict[str, list[str]] = {}
    for spec in specs:
        label, _, genes = spec.rpartition("=")
        names = [g.strip() for g in genes.split(",") if g.strip()]
        if not label.strip() or not names:
            raise ValueError(
                f"--markers {spec!r} is not LABEL=GENE1,GENE2,...; e.g. --markers "
                "'CD19+ B=MZB1,IGJ'."
            )
        sets[label.strip()] = names
    return sets


def check_marker_sets(
    sets: dict[str, list[str]], labels: Sequence[str], genes: Sequence[str]
) -> dict[str, list[str]]:
    """``sets`` when every label is a label of the data and every gene one of the model's."""
    known = set(genes)
    for label, markers in sets.items():
        if label not in labels:
            raise ValueError(
                f"--markers label {label!r} is not a label of the real cells (one of: "
                f"{', '.join(labels[:12])}); pass a label as it appears in --condition-key."
            )
        for gene in markers:
            if gene not in known:
                close = difflib.get_close_matches(gene, genes, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"--markers gene {gene!r} for {label!r} is not one of the model's "
                    f"{len(genes)} genes{hint}; pass genes the model generates."
                )
    return sets


def _defaults() -> argparse.Namespace:
    """``sedd quality``'s flags as parsed with none given."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["quality"])


def _read_real(path: Path) -> anndata.AnnData:
    from sedd.io.read import read_counts

    if not path.is_file():
        raise FileNotFoundError(
            f"--real {path}: no such file; pass a labelled .h5ad of real counts "
            f"(default {BUNDLED_DATA})."
        )
    return read_counts(path, what="--real")


def _check_key(real: anndata.AnnData, path: Path, key: str) -> None:
    if key not in real.obs.columns:
        raise ValueError(
            f"--condition-key {key!r} is not an obs column of --real {path} (columns: "
            f"{', '.join(map(str, real.obs.columns))}); pass the column that holds the labels."
        )


def _split(real: anndata.AnnData, args: argparse.Namespace, value: str) -> anndata.AnnData:
    """The real cells whose --split-key is ``value`` and whose label is set."""
    key = args.split_key
    if key not in real.obs.columns:
        raise ValueError(
            f"--split-key {key!r} is not an obs column of --real {args.real} (columns: "
            f"{', '.join(map(str, real.obs.columns))}); pass the column of the train/test split."
        )
    split = real.obs[key].astype(str)
    keep = ((split == str(value)) & real.obs[args.condition_key].notna()).to_numpy()
    if not keep.any():
        flag = "--train-value" if value == args.train_value else "--test-value"
        values = ", ".join(sorted(split.unique())[:10])
        raise ValueError(
            f"{flag} {value!r}: no labelled cell of --real {args.real} has {key} == {value!r} "
            f"(values: {values})."
        )
    return real[keep]


def _subset(cells: anndata.AnnData, n: int, seed: int) -> anndata.AnnData:
    import numpy as np

    rows = np.sort(np.random.default_rng(seed).choice(cells.n_obs, n, replace=False))
    return cells[rows]


def _labelled(
    cells: anndata.AnnData, genes: Sequence[str], args: argparse.Namespace
) -> LabelledCounts:
    from sedd.eval.gene_metrics import as_count_matrix
    from sedd.eval.quality_report import LabelledCounts
    from sedd.io.read import align_genes

    counts = as_count_matrix(align_genes(cells, genes).X, f"--real {args.real}")
    return LabelledCounts.of(counts, cells.obs[args.condition_key])


def _generated_counts(sets: Sequence[anndata.AnnData]) -> tuple[LabelledCounts, np.ndarray]:
    """All seeds' cells, labelled, and the seed of each."""
    import numpy as np

    from sedd.eval.quality_report import LabelledCounts

    counts = np.vstack([cells.X.toarray() for cells in sets])
    labels = np.concatenate([cells.obs["condition"].astype(str).to_numpy() for cells in sets])
    seeds = np.concatenate([cells.obs["seed"].to_numpy() for cells in sets])
    return LabelledCounts.of(counts, labels), seeds
