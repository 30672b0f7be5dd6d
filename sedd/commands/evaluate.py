"""``sedd evaluate``: how close are generated cells to real ones (metrics.json, tables, plots)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from sedd.commands.evaluate_perturbation import add_arguments as add_perturbation_arguments
from sedd.commands.evaluate_perturbation import run as run_perturbation

if TYPE_CHECKING:
    import anndata

# Auto-detected condition columns, first present in both files wins.
CONDITION_CANDIDATES = ("perturbation", "condition", "bulk_labels", "cell_type")

# (key, label, what is ideal) for the overall table, in display order.
OVERALL_ROWS = (
    ("n_real", "real cells", ""),
    ("n_gen", "generated cells", ""),
    ("gene_mean_pearson", "per-gene mean Pearson r", "1"),
    ("gene_mean_spearman", "per-gene mean Spearman rho", "1"),
    ("zero_fraction_real", "zero fraction, real", ""),
    ("zero_fraction_gen", "zero fraction, generated", "= real"),
    ("zero_fraction_gene_mae", "per-gene zero fraction MAE", "0"),
    ("library_size_mean_real", "library size mean, real", ""),
    ("library_size_mean_gen", "library size mean, generated", "= real"),
    ("library_size_median_real", "library size median, real", ""),
    ("library_size_median_gen", "library size median, generated", "= real"),
    ("library_size_ks", "library size KS statistic", "0"),
    ("corr_rms", "gene-gene correlation RMS error", "0"),
    ("corr_mean_abs", "gene-gene correlation mean abs error", "0"),
    ("n_pcs", "PCs (fitted on real)", ""),
    ("mmd2_rbf", "MMD^2 (RBF, unbiased)", "0"),
    ("energy_distance", "energy distance", "0"),
    ("frechet_distance", "Frechet distance", "0"),
    ("knn_auc", "kNN real-vs-generated AUC", "0.5"),
)
CONDITION_COLUMNS = (
    ("n_real", "real"),
    ("n_gen", "gen"),
    ("gene_mean_pearson", "mean r"),
    ("zero_fraction_gene_mae", "zero MAE"),
    ("library_size_ks", "lib KS"),
    ("corr_rms", "corr RMS"),
    ("mmd2_rbf", "MMD^2"),
    ("energy_distance", "energy"),
    ("frechet_distance", "Frechet"),
    ("knn_auc", "kNN AUC"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="compare generated cells to real cells",
        description="Compare generated to real counts (both h5ad, raw integer counts, genes "
        "matched by name) after normalising to 1e4 and log1p: per-gene means, zero fractions, "
        "library sizes, gene-gene correlations, and MMD^2 / energy / Frechet distance / kNN AUC "
        "on a PCA fitted to the real cells; overall and per condition. Writes metrics.json and "
        "PNG plots.",
    )
    p.add_argument("--real", type=Path, required=True, help="real cells, .h5ad with counts in X")
    p.add_argument(
        "--generated",
        type=Path,
        default=None,
        help="generated cells, .h5ad (required, except with --perturbation --model)",
    )
    p.add_argument(
        "--condition-key",
        default=None,
        help="obs column with condition labels in the generated file (and the real file unless "
        f"--real-condition-key); default: first of {', '.join(CONDITION_CANDIDATES)} in both",
    )
    p.add_argument("--real-condition-key", default=None, help="condition column of the real file")
    p.add_argument(
        "--out-dir", type=Path, default=None, help="default: <generated stem>_eval/ beside it"
    )
    p.add_argument(
        "--n-pcs",
        type=int,
        default=None,
        help="PCA components (fitted on real); default 50, 30 with --perturbation",
    )
    p.add_argument(
        "--max-cells", type=int, default=2000, help="cells per side for the pairwise metrics"
    )
    p.add_argument("--top-genes", type=int, default=100, help="genes in the correlation matrices")
    p.add_argument("--seed", type=int, default=0, help="subsampling and kNN folds")
    p.add_argument("--split-key", default="split", help="obs column of the real split")
    p.add_argument(
        "--split-value",
        default=None,
        help="keep only real cells with obs[split-key] == this (e.g. test); default: all cells",
    )
    p.add_argument(
        "--pca-fit-on-rest",
        action="store_true",
        help="fit the PCA on the real cells outside --split-value instead of the compared ones, "
        "so real and generated cells are both projected out-of-sample (recommended for small "
        "splits: an in-sample fit inflates the distances even for a perfect generator)",
    )
    p.add_argument(
        "--st3-metrics",
        action="store_true",
        help="also write kleonlab/st3's per-perturbation files into --out-dir "
        "(generation_metrics_per_perturbation.json/.csv, generation_metrics_aggregate.json: "
        "sliced W2, MMD^2 on <= 100 cells, Frechet distance on <= 50 PCs, on .X as stored); "
        "needs a condition column in both files",
    )
    add_perturbation_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.perturbation:
        return run_perturbation(args)
    if args.generated is None:
        raise ValueError(
            "--generated FILE is required (only --perturbation takes --model instead)."
        )
    # Heavy imports here, so other sub-commands don't pay for them.
    from sedd.eval.gene_metrics import METRIC_SCALES
    from sedd.eval.label_mix import compare_label_mixes
    from sedd.eval.metrics import as_count_matrix, evaluate_counts_with_arrays
    from sedd.eval.plots import write_evaluation_plots

    console = Console(width=max(Console().width, 160))
    real, gen = _read_h5ad(args.real, "--real"), _read_h5ad(args.generated, "--generated")
    n_real_file = real.n_obs
    if args.pca_fit_on_rest and args.split_value is None:
        raise ValueError("--pca-fit-on-rest needs --split-value: it fits on the other cells.")
    rest = None
    if args.split_value is not None:
        real, rest = _split(real, args.split_key, args.split_value)
        console.print(
            f"real: {real.n_obs} of {n_real_file} cells with {args.split_key} == "
            f"{args.split_value!r}"
        )
    genes, gen_columns = _shared_genes(real, gen, console)
    real_key, gen_key = _condition_keys(real, gen, args.condition_key, args.real_condition_key)
    st3_keys = _st3_keys(args.st3_metrics, real_key, gen_key)
    console.print(
        f"conditions: real obs[{real_key!r}] vs generated obs[{gen_key!r}]"
        if gen_key
        else "conditions: none (no condition column found in both files); overall only"
    )

    real_counts = as_count_matrix(real[:, genes].X, f"--real {args.real}")
    gen_counts = as_count_matrix(gen.X[:, gen_columns], f"--generated {args.generated}")
    result, arrays = evaluate_counts_with_arrays(
        real_counts,
        gen_counts,
        genes,
        real_conditions=real.obs[real_key].to_numpy() if real_key else None,
        gen_conditions=gen.obs[gen_key].to_numpy() if gen_key else None,
        n_pcs=args.n_pcs or 50,
        max_cells=args.max_cells,
        seed=args.seed,
        top_k_genes=args.top_genes,
        pca_fit_counts=as_count_matrix(rest[:, genes].X, "PCA-fit cells")
        if args.pca_fit_on_rest
        else None,
    )
    inputs = _inputs(args, n_real_file, real, gen, len(genes), real_key, gen_key)
    result = {"inputs": inputs, "scale": METRIC_SCALES, **result}
    if real_key and gen_key:
        mix = compare_label_mixes(real.obs[real_key], gen.obs[gen_key])
        result["label_mix"] = mix.as_dict()
        if (warning := mix.warning(real_key, str(args.generated))) is not None:
            console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    _report(console, args, result, arrays, write_evaluation_plots)
    if st3_keys is not None:
        _write_st3_metrics(console, _out_dir(args), real[:, genes], gen[:, gen_columns], st3_keys)
    return 0


def _st3_keys(wanted: bool, real_key: str | None, gen_key: str | None) -> tuple[str, str] | None:
    """(real, generated) perturbation columns for --st3-metrics; None when not asked for."""
    if not wanted:
        return None
    if real_key is None or gen_key is None:
        raise ValueError(
            "--st3-metrics needs a perturbation column in both files and none was found; pass "
            "--condition-key (generated) and --real-condition-key (real), e.g. "
            "--condition-key perturbation --real-condition-key gene."
        )
    return real_key, gen_key


def _write_st3_metrics(
    console: Console,
    out_dir: Path,
    real: anndata.AnnData,
    gen: anndata.AnnData,
    keys: tuple[str, str],
) -> None:
    """st3's three metric files, on the same cells and shared genes as metrics.json."""
    from sedd.eval.st3_metrics import MMD_NOISE_NOTE, compute_st3_metrics

    metrics = compute_st3_metrics(real, gen, real_key=keys[0], generated_key=keys[1])
    for path in metrics.write(out_dir):
        console.print(f"wrote {path}")
    if metrics.skipped:
        console.print(
            f"st3 metrics: skipped {len(metrics.skipped)} perturbation(s) with < 2 real or "
            f"generated cells, e.g. {[str(label) for label in metrics.skipped[:5]]}"
        )
    console.print(MMD_NOISE_NOTE, highlight=False)


def _inputs(
    args: argparse.Namespace,
    n_real_file: int,
    real: anndata.AnnData,
    gen: anndata.AnnData,
    shared_genes: int,
    real_key: str | None,
    gen_key: str | None,
) -> dict[str, Any]:
    """What was compared, for metrics.json."""
    split = None
    if args.split_value is not None:
        split = {"key": args.split_key, "value": args.split_value}
    return {
        "real": str(args.real),
        "generated": str(args.generated),
        "real_cells_in_file": n_real_file,
        "real_cells_used": real.n_obs,
        "real_split": split,
        "generated_cells": gen.n_obs,
        "genes_real": real.n_vars,
        "genes_generated": gen.n_vars,
        "genes_shared": shared_genes,
        "condition_key_real": real_key,
        "condition_key_generated": gen_key,
    }


def _report(
    console: Console,
    args: argparse.Namespace,
    result: dict[str, Any],
    arrays: Any,
    write_plots: Any,
) -> None:
    """Print the tables, write metrics.json and the plots."""
    from sedd.io.files import write_json_atomic

    console.print(_overall_table(result["overall"]))
    if result["per_condition"]:
        console.print(_condition_table(result["per_condition"]))
    out_dir = _out_dir(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out_dir / "metrics.json", result)
    console.print(f"wrote {out_dir / 'metrics.json'}")
    if arrays is None:
        console.print(f"no plots: {result['overall'].get('skipped')}")
    else:
        pearson = result["overall"].get("gene_mean_pearson")
        for path in write_plots(arrays, out_dir, pearson=pearson):
            console.print(f"wrote {path}")


def _out_dir(args: argparse.Namespace) -> Path:
    return args.out_dir or args.generated.parent / f"{args.generated.stem}_eval"


def _read_h5ad(path: Path, flag: str) -> anndata.AnnData:
    from sedd.io.read import read_h5ad_safely

    if not path.is_file():
        raise FileNotFoundError(f"{flag} file not found: {path}")
    try:
        adata = read_h5ad_safely(path, what=flag)
    except OSError as exc:
        raise ValueError(f"{flag} {path} is not a readable .h5ad file: {exc}") from exc
    if not adata.var_names.is_unique:
        duplicates = adata.var_names[adata.var_names.duplicated()].unique()[:5].tolist()
        raise ValueError(
            f"{flag} {path} has duplicate gene names (e.g. {duplicates}); genes are matched by "
            "name, so make them unique first (AnnData.var_names_make_unique())."
        )
    return adata


def _split(real: anndata.AnnData, key: str, value: str) -> tuple[anndata.AnnData, anndata.AnnData]:
    """The real cells with obs[key] == value, and the others."""
    if key not in real.obs.columns:
        raise ValueError(
            f"--split-key {key!r} is not an obs column of the real file; "
            f"available: {list(real.obs.columns)}."
        )
    keep = (real.obs[key].astype(str) == str(value)).to_numpy()
    if not keep.any():
        values = sorted(real.obs[key].astype(str).unique())[:10]
        raise ValueError(f"no real cell has {key} == {value!r}; values include {values}.")
    return real[keep], real[~keep]


def _shared_genes(
    real: anndata.AnnData, gen: anndata.AnnData, console: Console
) -> tuple[list[str], list[int]]:
    """Genes in both files in the real file's order, and their column indices in ``gen``."""
    gen_index = {name: i for i, name in enumerate(gen.var_names)}
    genes = [name for name in real.var_names if name in gen_index]
    if len(genes) < 2:
        hint = ""
        if list(gen.var_names[:3]) == ["0", "1", "2"]:
            hint = (
                " The generated genes are named 0..G-1 (st3 writes no gene names): copy the "
                "training data's var_names onto the generated file first."
            )
        raise ValueError(
            f"the files share {len(genes)} gene names (real has {real.n_vars}, generated "
            f"{gen.n_vars}, e.g. {list(real.var_names[:3])} vs {list(gen.var_names[:3])}); "
            f"need >= 2.{hint}"
        )
    if len(genes) < max(real.n_vars, gen.n_vars):
        console.print(
            f"genes: using the {len(genes)} shared; dropped {real.n_vars - len(genes)} only in "
            f"the real file and {gen.n_vars - len(genes)} only in the generated file"
        )
    return genes, [gen_index[name] for name in genes]


def _condition_keys(
    real: anndata.AnnData, gen: anndata.AnnData, key: str | None, real_key: str | None
) -> tuple[str | None, str | None]:
    if key is None and real_key is not None:
        raise ValueError("--real-condition-key needs --condition-key for the generated file.")
    if key is None:
        for candidate in CONDITION_CANDIDATES:
            if candidate in real.obs.columns and candidate in gen.obs.columns:
                return candidate, candidate
        return None, None
    real_key = real_key or key
    for which, adata, column in (("real", real, real_key), ("generated", gen, key)):
        if column not in adata.obs.columns:
            raise ValueError(
                f"condition key {column!r} is not an obs column of the {which} file; "
                f"available: {list(adata.obs.columns)}."
            )
    return real_key, key


def _format(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _overall_table(overall: dict) -> Table:
    table = Table(title="generated vs real, overall")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("ideal", justify="right")
    for key, label, ideal in OVERALL_ROWS:
        if key in overall:
            table.add_row(label, _format(overall[key]), ideal)
    if "skipped" in overall:
        table.add_row("note", overall["skipped"], "")
    return table


def _condition_table(per_condition: dict) -> Table:
    table = Table(title="generated vs real, per condition")
    table.add_column("condition")
    for _, label in CONDITION_COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("note")
    for condition, metrics in per_condition.items():
        cells = [_format(metrics.get(key)) for key, _ in CONDITION_COLUMNS]
        table.add_row(condition, *cells, metrics.get("skipped", ""))
    return table
