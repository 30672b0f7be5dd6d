"""The perturbation report's files, in the schemas labs compare with.

* ``per_pert_metrics.json``: {"scale", "perturbations": {p: {n_cells_per_side,
  n_significant_genes, model: {metric: value}, cell_mean_baseline: {...},
  split_half_ceiling: {...}}}, "skipped"};
* ``per_pert_metrics.csv``: one row per perturbation; columns ``<metric>`` (model),
  ``<metric>_baseline``, ``<metric>_ceiling``;
* ``summary_metrics.json``: per metric and method, mean and std over perturbations, the scale and
  how the cells were matched;
* ``de_tables.csv``: per perturbation and gene, the reference half's LFC, p, BH q, whether it is
  significant, and each method's LFC.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sedd.eval.perturbation import METHODS, METRICS, SCALE, PerturbationReport
from sedd.io.files import write_json_atomic

__all__ = ["CSV_SUFFIX", "per_pert_rows", "write_report_files"]

CSV_SUFFIX = {"model": "", "cell_mean_baseline": "_baseline", "split_half_ceiling": "_ceiling"}


def per_pert_rows(report: PerturbationReport) -> list[dict[str, Any]]:
    """The per-perturbation CSV rows (wide: one column per metric and method)."""
    rows = []
    for pert, values in report.per_perturbation.items():
        row: dict[str, Any] = {
            "perturbation": pert,
            "n_cells_per_side": values["n_cells_per_side"],
            "n_significant_genes": values["n_significant_genes"],
        }
        for method in METHODS:
            for metric in METRICS:
                row[f"{metric}{CSV_SUFFIX[method]}"] = values[method][metric]
        rows.append(row)
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_report_files(
    report: PerturbationReport, out_dir: Path, inputs: dict[str, Any]
) -> list[Path]:
    """Write the four files into ``out_dir`` (created) and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    per_pert = {
        "scale": SCALE,
        "inputs": inputs,
        "perturbations": report.per_perturbation,
        "skipped": report.skipped,
    }
    paths = [out_dir / name for name in ("per_pert_metrics.json", "summary_metrics.json")]
    write_json_atomic(paths[0], per_pert)
    write_json_atomic(paths[1], {"inputs": inputs, **report.summary()})
    for name, rows in (
        ("per_pert_metrics.csv", per_pert_rows(report)),
        ("de_tables.csv", report.de_rows),
    ):
        _write_csv(out_dir / name, rows)
        paths.append(out_dir / name)
    return paths
