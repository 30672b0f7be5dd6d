"""cell-eval's metric family on the perturbation report's own cells, by the ``cell-eval`` library
(Arc Institute; ``pip install -e '.[eval]'``), not re-implemented here.

Each method of the report (model, cell-mean baseline, split-half ceiling) is scored as one
cell-eval prediction: the "real" AnnData holds every perturbation's reference half and all real
control cells; the "prediction" holds that method's k cells per perturbation (the same cells the
report's distances used, so both sides have k cells) and the same real control cells.

**Scale, said explicitly.** Both AnnData hold log1p-CP10k values (float32) and cell-eval is told
so: ``pdex_kwargs={"is_log1p": True}`` for its differential expression. cell-eval 0.8's
``MetricsEvaluator`` has no scale argument of its own; it guesses from the values
(``cell_eval.utils.guess_is_lognorm``), so the guess is checked to agree before running, and a
disagreement is an error rather than a silent re-normalisation.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import numpy as np

from sedd.eval.perturbation import METHODS, SCALE, PerturbationReport

__all__ = [
    "CELL_EVAL_METRICS",
    "PERT_COLUMN",
    "cell_eval_available",
    "cell_eval_metrics",
]

# The family the issue names -> cell-eval 0.8's column for it (None: the library has none).
CELL_EVAL_METRICS: dict[str, str | None] = {
    "discrimination_score_l1": "discrimination_score_l1",
    "pearson_delta": "pearson_delta",
    "overlap_at_n": "overlap_at_N",
    "mae": "mae",
    "de_spearman_lfc_sig": "de_spearman_lfc_sig",
    "mae_log2fc_sig": None,
    "pr_auc": "pr_auc",
}
PERT_COLUMN = "perturbation"


def cell_eval_available() -> bool:
    """Whether the ``cell_eval`` package is importable."""
    return importlib.util.find_spec("cell_eval") is not None


def _anndata(values: np.ndarray, labels: list[str], genes: list[str]) -> Any:
    import anndata
    import pandas as pd

    obs = pd.DataFrame(
        {PERT_COLUMN: pd.Categorical(labels)}, index=[f"cell{i}" for i in range(len(labels))]
    )
    return anndata.AnnData(
        np.asarray(values, dtype=np.float32), obs=obs, var=pd.DataFrame(index=genes)
    )


def _pair(
    report: PerturbationReport,
    real_log: np.ndarray,
    gen_log: np.ndarray,
    control_rows: np.ndarray,
    method: str,
) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
    """(real values, real labels, predicted values, predicted labels) for one method."""
    control = report.params["control_label"]
    real_blocks, pred_blocks = [real_log[control_rows]], [real_log[control_rows]]
    real_labels = [control] * len(control_rows)
    pred_labels = list(real_labels)
    for pert, sides in report.sides.items():
        real_blocks.append(real_log[sides["reference"]])
        pred_blocks.append((gen_log if method == "model" else real_log)[sides[method]])
        real_labels += [pert] * len(sides["reference"])
        pred_labels += [pert] * len(sides[method])
    return np.vstack(real_blocks), real_labels, np.vstack(pred_blocks), pred_labels


def cell_eval_metrics(
    report: PerturbationReport,
    real_log: np.ndarray,
    gen_log: np.ndarray,
    real_labels: np.ndarray,
    genes: list[str],
    out_dir: Path,
    *,
    num_threads: int = 1,
) -> dict[str, Any]:
    """Per method, cell-eval's per-perturbation values of ``CELL_EVAL_METRICS``.

    ``real_log``/``gen_log`` are the report's log1p-CP10k matrices (rows as its ``sides``);
    cell-eval writes its DE tables under ``out_dir/cell_eval/<method>/``. Returns
    {"scale", "cell_eval_version", "unavailable", "per_perturbation": {p: {method: {metric:
    value}}}, "summary": {metric: {method: {"mean", "std", "n"}}}}.
    """
    if not cell_eval_available():
        raise ValueError(
            "the cell-eval metrics need the cell-eval package; install the eval extra "
            "(pip install -e '.[eval]') or run without --cell-eval."
        )
    if len(report.sides) < 1:
        raise ValueError("no perturbation was evaluated, so there is nothing for cell-eval.")
    from importlib.metadata import version

    from cell_eval import MetricsEvaluator
    from cell_eval.utils import guess_is_lognorm

    logging.getLogger("cell_eval").setLevel(logging.WARNING)
    control = report.params["control_label"]
    control_rows = np.flatnonzero(np.asarray(real_labels, dtype=object) == control)
    per_pert: dict[str, dict[str, dict[str, float | None]]] = {p: {} for p in report.sides}
    for method in METHODS:
        real_x, real_lab, pred_x, pred_lab = _pair(report, real_log, gen_log, control_rows, method)
        real, pred = _anndata(real_x, real_lab, genes), _anndata(pred_x, pred_lab, genes)
        for which, adata in (("real", real), ("prediction", pred)):
            if not guess_is_lognorm(adata):
                raise ValueError(
                    f"cell-eval would read the {which} cells as counts, not {SCALE}; this is a "
                    "bug in the report, please file it with the command that showed it."
                )
        evaluator = MetricsEvaluator(
            adata_pred=pred,
            adata_real=real,
            control_pert=control,
            pert_col=PERT_COLUMN,
            num_threads=num_threads,
            outdir=str(out_dir / "cell_eval" / method),
            pdex_kwargs={"is_log1p": True},  # the scale, said: values are log1p-CP10k
        )
        results, _ = evaluator.compute(profile="full", write_csv=True)
        for record in results.to_dicts():
            pert = str(record["perturbation"])
            if pert in per_pert:
                per_pert[pert][method] = {
                    name: _number(record.get(column)) if column else None
                    for name, column in CELL_EVAL_METRICS.items()
                }
    return {
        "scale": SCALE,
        "is_log1p_passed": True,
        "cell_eval_version": version("cell-eval"),
        "unavailable": {
            name: "not in this cell-eval's metric registry"
            for name, column in CELL_EVAL_METRICS.items()
            if column is None
        },
        "per_perturbation": per_pert,
        "summary": _summary(per_pert),
    }


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else None


def _summary(per_pert: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in CELL_EVAL_METRICS:
        out[name] = {}
        for method in METHODS:
            values = [
                v[method][name]
                for v in per_pert.values()
                if method in v and v[method][name] is not None
            ]
            out[name][method] = {
                "mean": float(np.mean(values)) if values else None,
                "std": float(np.std(values)) if values else None,
                "n": len(values),
            }
    return out
