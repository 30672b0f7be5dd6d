"""``sedd evaluate --perturbation``: the perturbation report, with the cell-mean baseline and the
split-half ceiling beside every figure (``sedd.eval.perturbation``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from sedd.commands.evaluate_model_cells import UNKNOWN_REASON
from sedd.commands.evaluate_model_cells import add_arguments as add_model_cell_arguments

if TYPE_CHECKING:
    import anndata
    import numpy as np

    from sedd.eval.count_table import CountTableRow
    from sedd.eval.perturbation import PerturbationReport

# Perturbation columns looked for when no key is given, first present wins.
PERT_CANDIDATES = ("perturbation", "condition")
DEFAULT_PCS = 30


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags only the perturbation report reads (``--real``, ``--generated``, keys, split,
    ``--n-pcs``, ``--max-cells``, ``--seed`` and ``--out-dir`` are ``sedd evaluate``'s own)."""
    group = p.add_argument_group("perturbation report (--perturbation)")
    group.add_argument(
        "--perturbation",
        action="store_true",
        help="write the perturbation report instead: per perturbation W2 / MMD^2 / Frechet on "
        f"PCs (default {DEFAULT_PCS}), LFC recovery over significant genes and a rank across "
        "perturbations, each beside a cell-mean baseline and a split-half ceiling, at equal "
        "cell numbers (--max-cells caps each side), and a count-level KS table; "
        "per_pert_metrics.json/.csv, summary_metrics.json, de_tables.csv, count_table.json, "
        "st3's generation_metrics_* files and lfc_scatter.png in --out-dir",
    )
    group.add_argument(
        "--control-label",
        default=None,
        help="control perturbation label of the real file (default: its uns['control_label'])",
    )
    group.add_argument(
        "--split-json",
        type=Path,
        default=None,
        help='held-out conditions as scLDM writes them, {"cell_type": [...], "pert": [...]}: '
        "keep the real cells of those perturbations (and cell types) plus control cells",
    )
    group.add_argument(
        "--cell-type-key", default=None, help="obs column of cell types, for --split-json"
    )
    group.add_argument(
        "--fdr", type=float, default=0.05, help="BH FDR below which a gene is significant"
    )
    add_model_cell_arguments(p)
    group.add_argument(
        "--cell-eval",
        action="store_true",
        help="also score cell-eval's metric family with the cell-eval library (pip install -e "
        "'.[eval]') on the same cells, passing the scale (log1p-CP10k) explicitly",
    )


def run(args: argparse.Namespace) -> int:
    from sedd.eval.count_table import count_table, count_table_json
    from sedd.eval.gene_metrics import as_count_matrix
    from sedd.eval.perturbation import PerturbationOptions, evaluate_perturbations
    from sedd.eval.perturbation_files import write_report_files
    from sedd.eval.perturbation_plots import LFC_PLOT, write_lfc_scatter
    from sedd.io.files import write_json_atomic

    console = Console(width=max(Console().width, 120))
    if (args.generated is None) == (args.model is None):
        raise ValueError(
            "--perturbation needs --generated FILE (cells to judge) or --model PATH (generate "
            "them), exactly one."
        )
    real = _read(args.real, "--real")
    real_key = _key(real, args.real_condition_key or args.condition_key, "real")
    control = args.control_label or real.uns.get("control_label")
    if control is None:
        raise ValueError(
            "--control-label is needed: the real file's uns has no 'control_label'; pass the "
            f"label of its control cells in obs[{real_key!r}]."
        )
    real, rest, split = _held_out(real, args, real_key, str(control))
    out_dir = args.out_dir or _default_out_dir(args)
    unknown: list[str] = []
    if args.model is not None:
        from sedd.commands.evaluate_model_cells import GENERATED_KEY, generate_for_real

        labels = real.obs[real_key].astype(str).tolist()
        made = generate_for_real(args, labels, out_dir, console)
        gen, gen_key, unknown, generated = made.cells, GENERATED_KEY, made.unknown, made.path
    else:
        gen, generated = _read(args.generated, "--generated"), args.generated
        gen_key = _key(gen, args.condition_key, "generated")
    genes = [g for g in real.var_names if g in set(gen.var_names)]
    if len(genes) < 2:
        raise ValueError(f"the files share {len(genes)} gene names; need >= 2 with equal names.")
    semi_synthetic = bool(real.uns.get("semi_synthetic", False))
    if semi_synthetic:
        console.print("[bold]SEMI-SYNTHETIC real file[/bold]: " + str(real.uns.get("description")))
    options = PerturbationOptions(
        control_label=str(control),
        n_pcs=args.n_pcs or DEFAULT_PCS,
        max_cells=args.max_cells,
        fdr=args.fdr,
        seed=args.seed,
    )
    real_counts = as_count_matrix(real[:, genes].X, f"--real {args.real}")
    gen_counts = as_count_matrix(gen[:, genes].X, f"generated cells {generated}")
    train_counts = None if rest is None else as_count_matrix(rest[:, genes].X, "PCA-fit cells")
    report = evaluate_perturbations(
        real_counts,
        real.obs[real_key].astype(str).to_numpy(),
        gen_counts,
        gen.obs[gen_key].astype(str).to_numpy(),
        genes,
        options,
        pca_fit_counts=train_counts,
    )
    report.skipped.update({label: UNKNOWN_REASON for label in unknown})
    inputs = {
        "real": str(args.real),
        "generated": str(generated),
        "model": None if args.model is None else str(args.model),
        "steps": args.steps,
        "unknown_to_model": unknown,
        "real_key": real_key,
        "generated_key": gen_key,
        "control_label": str(control),
        "held_out": split,
        "real_cells_used": real.n_obs,
        "input_scale": "counts",
        "semi_synthetic": semi_synthetic,
    }
    console.print(_summary_table(report))
    console.print(report.params["equal_cells"], highlight=False)
    if report.skipped:
        console.print(f"skipped: {report.skipped}", highlight=False)
    for path in write_report_files(report, out_dir, inputs):
        console.print(f"wrote {path}")
    if (plot := write_lfc_scatter(report.de_rows, out_dir / LFC_PLOT)) is not None:
        console.print(f"wrote {plot}")
    _write_st3_files(console, real[:, genes], gen[:, genes], (real_key, gen_key), out_dir)
    table = count_table(gen_counts, real_counts, train_counts, seed=args.seed)
    console.print(_count_table(table))
    write_json_atomic(out_dir / "count_table.json", {"inputs": inputs, **count_table_json(table)})
    console.print(f"wrote {out_dir / 'count_table.json'}")
    if args.cell_eval:
        from sedd.eval.gene_metrics import log_normalize
        from sedd.eval.perturbation_celleval import cell_eval_metrics

        scored = cell_eval_metrics(
            report,
            log_normalize(real_counts),
            log_normalize(gen_counts),
            real.obs[real_key].astype(str).to_numpy(),
            genes,
            out_dir,
        )
        write_json_atomic(out_dir / "cell_eval_metrics.json", {"inputs": inputs, **scored})
        console.print(_cell_eval_table(scored["summary"]))
        for name, why in scored["unavailable"].items():
            console.print(f"cell-eval: {name} unavailable: {why}", highlight=False)
        console.print(f"wrote {out_dir / 'cell_eval_metrics.json'}")
    return 0


def _write_st3_files(
    console: Console,
    real: anndata.AnnData,
    gen: anndata.AnnData,
    keys: tuple[str, str],
    out_dir: Path,
) -> None:
    """st3's ``generation_metrics_*`` files on the same cells and genes, counts as stored (st3's
    schema, so no scale key inside: the report's other files record it)."""
    from sedd.eval.st3_metrics import MMD_NOISE_NOTE, compute_st3_metrics

    try:
        metrics = compute_st3_metrics(real, gen, real_key=keys[0], generated_key=keys[1])
    except ValueError as err:
        console.print(f"st3's generation_metrics files not written: {err}", highlight=False)
        return
    for path in metrics.write(out_dir):
        console.print(f"wrote {path}")
    console.print(MMD_NOISE_NOTE, highlight=False)


def _default_out_dir(args: argparse.Namespace) -> Path:
    """``<generated stem>_perturbation_eval/`` beside the generated file, else beside --real."""
    source = args.real if args.generated is None else args.generated
    return source.parent / f"{source.stem}_perturbation_eval"


def _read(path: Path, flag: str) -> anndata.AnnData:
    from sedd.io.read import read_h5ad_safely

    if not path.is_file():
        raise FileNotFoundError(f"{flag} file not found: {path}")
    return read_h5ad_safely(path, what=flag)


def _key(adata: anndata.AnnData, key: str | None, which: str) -> str:
    if key is not None and key not in adata.obs.columns:
        raise ValueError(
            f"perturbation key {key!r} is not an obs column of the {which} file; available: "
            f"{list(adata.obs.columns)}."
        )
    found = key or next((c for c in PERT_CANDIDATES if c in adata.obs.columns), None)
    if found is None:
        raise ValueError(
            f"the {which} file has none of the obs columns {list(PERT_CANDIDATES)}; name its "
            "perturbation column with --condition-key (generated) / --real-condition-key (real)."
        )
    return found


def _held_out(
    real: anndata.AnnData, args: argparse.Namespace, real_key: str, control: str
) -> tuple[anndata.AnnData, anndata.AnnData | None, dict[str, Any] | None]:
    """(held-out real cells, the other real cells for the PCA fit, the split): by
    --split-json, else --split-key == --split-value, else all cells held out and no rest."""
    from sedd.eval.heldout_split import held_out_mask, read_split_json

    if args.split_json is not None:
        split = read_split_json(args.split_json)
        mask = held_out_mask(
            real.obs,
            split,
            pert_key=real_key,
            control_label=control,
            cell_type_key=args.cell_type_key,
        )
        return real[mask], _rest(real, mask), {"split_json": str(args.split_json), **split}
    if args.split_value is not None:
        if args.split_key not in real.obs.columns:
            raise ValueError(
                f"--split-key {args.split_key!r} is not an obs column of the real file; "
                f"available: {list(real.obs.columns)}."
            )
        mask = (real.obs[args.split_key].astype(str) == str(args.split_value)).to_numpy()
        if not mask.any():
            raise ValueError(f"no real cell has {args.split_key} == {args.split_value!r}.")
        return real[mask], _rest(real, mask), {"key": args.split_key, "value": args.split_value}
    return real, None, None


def _rest(real: anndata.AnnData, held_out: np.ndarray) -> anndata.AnnData | None:
    """The real cells outside the held-out ones (the PCA is fitted there), if there are enough."""
    return real[~held_out] if (~held_out).sum() >= DEFAULT_PCS else None


def _cell(stats: dict[str, Any]) -> str:
    if stats["mean"] is None:
        return "-"
    return f"{stats['mean']:.4g} ± {stats['std']:.2g}"


def _summary_table(report: PerturbationReport) -> Table:
    from sedd.eval.perturbation import METHODS

    summary = report.summary()
    table = Table(
        title=f"perturbation report ({summary['n_perturbations']} perturbations, mean ± std, "
        f"{summary['scale']})"
    )
    for column in ("metric", *METHODS, "ideal"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric, values in summary["metrics"].items():
        table.add_row(metric, *(_cell(values[m]) for m in METHODS), f"{values['ideal']:g}")
    return table


def _count_table(table: dict[str, CountTableRow]) -> Table:
    from sedd.eval.count_table import PAIR_GENES

    out = Table(
        title="count-level table, KS to held-out cells",
        caption=f"raw counts; gene pairs over the {PAIR_GENES} most variable genes; train cells "
        "subsampled to equal numbers",
    )
    for column in ("statistic", "generated", "train (real)"):
        out.add_column(column, justify="left" if column == "statistic" else "right")
    for name, row in table.items():
        train = "-" if row.train_vs_held_out is None else f"{row.train_vs_held_out:.3f}"
        out.add_row(name, f"{row.generated_vs_held_out:.3f}", train)
    return out


def _cell_eval_table(summary: dict[str, Any]) -> Table:
    from sedd.eval.perturbation import METHODS

    table = Table(title="cell-eval (the library), same cells, mean ± std")
    for column in ("metric", *METHODS):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric, values in summary.items():
        table.add_row(metric, *(_cell(values[m]) for m in METHODS))
    return table
