"""The perturbation report: generated against held-out real cells, per perturbation, with a
cell-mean baseline and a split-half ceiling beside every figure.

Input: raw counts of held-out real cells (a perturbation label per cell, control cells among
them) and of generated cells (a label per cell), on the same genes. Everything is computed on
log1p-CP10k values (``scale`` in the outputs); distances on ``n_pcs`` principal components fitted
to all the real cells.

Per perturbation p with real cells R_p and generated cells G_p, one seeded shuffle splits R_p
into two disjoint halves, the *reference* and the *ceiling* half, and k = min(|R_p| / 2, |G_p|,
``max_cells``, cells available to the baseline) cells are taken from each side, so **every
comparison is k cells against the same k reference cells**:

* ``model``: k generated cells of p;
* ``cell_mean_baseline``: k real cells of the *other* held-out perturbations (control excluded):
  their mean is the mean perturbed response, the field's cell-mean baseline, and as a
  population it is what a model that ignores the perturbation would draw;
* ``split_half_ceiling``: the other k real cells of p (real against real: the best a model can
  score at this number of cells).

Figures: ``w2``, ``mmd2_rbf``, ``frechet`` (on the PCs; lower is better), ``lfc_slope`` and
``lfc_pearson`` (candidate vs reference LFCs against the real control cells, over the genes the
reference half calls significant: Wilcoxon rank-sum vs control, BH FDR < ``fdr``; 1 is best)
and ``rank`` (``normalised_rank`` of the candidate means among the reference means; 0 best).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.decomposition import PCA

from sedd.eval.gene_metrics import log_normalize
from sedd.eval.perturbation_metrics import (
    LFC_PSEUDOCOUNT,
    de_test,
    frechet_distance,
    lfc_recovery,
    log2_fold_change,
    mmd2_rbf,
    normalised_rank,
    w2_backend,
    w2_distance,
)

__all__ = [
    "METHODS",
    "METRICS",
    "SCALE",
    "PerturbationOptions",
    "PerturbationReport",
    "evaluate_perturbations",
]

SCALE = "log1p_cp10k"
METHODS = ("model", "cell_mean_baseline", "split_half_ceiling")
# metric -> its ideal value, in display order.
METRICS = {
    "w2": 0.0,
    "mmd2_rbf": 0.0,
    "frechet": 0.0,
    "lfc_slope": 1.0,
    "lfc_pearson": 1.0,
    "rank": 0.0,
}
MIN_CELLS = 3


@dataclass(frozen=True)
class PerturbationOptions:
    """How the report compares: the control label, PCs, per-side cap, DE threshold, seed."""

    control_label: str
    n_pcs: int = 30
    max_cells: int | None = None
    fdr: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_pcs < 2:
            raise ValueError(f"`n_pcs` must be >= 2, got {self.n_pcs}.")
        if self.max_cells is not None and self.max_cells < MIN_CELLS:
            raise ValueError(f"`max_cells` must be >= {MIN_CELLS} or None, got {self.max_cells}.")
        if not 0.0 < self.fdr < 1.0:
            raise ValueError(f"`fdr` must be in (0, 1), got {self.fdr}.")


@dataclass
class PerturbationReport:
    """Per perturbation: cells used, DE genes and, per method, each metric; plus the DE rows."""

    per_perturbation: dict[str, dict[str, Any]]
    skipped: dict[str, str]
    params: dict[str, Any]
    de_rows: list[dict[str, Any]] = field(default_factory=list)
    # Per perturbation, the rows each side used ("reference" and METHODS; "model" rows index
    # the generated cells, the others the real ones), so other judges can score the same cells.
    sides: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Per method and metric: mean, std (ddof 0) and n over the evaluated perturbations."""
        metrics: dict[str, dict[str, Any]] = {}
        for metric in METRICS:
            metrics[metric] = {"ideal": METRICS[metric]}
            for method in METHODS:
                values = [
                    row[method][metric]
                    for row in self.per_perturbation.values()
                    if row[method][metric] is not None
                ]
                metrics[metric][method] = {
                    "mean": float(np.mean(values)) if values else None,
                    "std": float(np.std(values)) if values else None,
                    "n": len(values),
                }
        return {
            "scale": SCALE,
            "n_perturbations": len(self.per_perturbation),
            "skipped": self.skipped,
            "metrics": metrics,
            "params": self.params,
        }


def _labels(labels: Sequence[Any], n: int, name: str) -> np.ndarray:
    out = np.asarray([str(v) for v in labels], dtype=object)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} labels for {n} cells; give one label per cell.")
    return out


def _fit_pca(real_log: np.ndarray, n_pcs: int, seed: int) -> PCA:
    n_components = min(n_pcs, real_log.shape[0] - 1, real_log.shape[1])
    return PCA(n_components=n_components, random_state=seed).fit(real_log)


def _sides(
    real_rows: np.ndarray,
    gen_rows: np.ndarray,
    pool_rows: np.ndarray,
    max_cells: int | None,
    rng: np.random.Generator,
) -> dict[str, np.ndarray] | None:
    """Row indices of the reference half and of each method's k cells (None: too few cells).
    Method rows index the real matrix except ``model``, which indexes the generated one."""
    k = min(len(real_rows) // 2, len(gen_rows), len(pool_rows))
    if max_cells is not None:
        k = min(k, max_cells)
    if k < MIN_CELLS:
        return None
    shuffled = rng.permutation(real_rows)
    return {
        "reference": shuffled[k : 2 * k],
        "split_half_ceiling": shuffled[:k],
        "model": rng.choice(gen_rows, size=k, replace=False),
        "cell_mean_baseline": rng.choice(pool_rows, size=k, replace=False),
    }


def evaluate_perturbations(
    real_counts: np.ndarray,
    real_labels: Sequence[Any],
    gen_counts: np.ndarray,
    gen_labels: Sequence[Any],
    genes: Sequence[str],
    options: PerturbationOptions,
    pca_fit_counts: np.ndarray | None = None,
) -> PerturbationReport:
    """The report on raw counts (real (N, G), generated (M, G), same gene order).

    ``pca_fit_counts``: real cells that take part in no comparison (e.g. the training split)
    to fit the PCA on, so every side is projected out of sample. Without them the PCA is fitted
    on the compared real cells, which spreads the real sides (their own noise is in the PCs) and
    flatters out-of-sample generated cells when there are few cells per perturbation.
    """
    real_labels = _labels(real_labels, len(real_counts), "real_labels")
    gen_labels = _labels(gen_labels, len(gen_counts), "gen_labels")
    control = options.control_label
    control_rows = np.flatnonzero(real_labels == control)
    if len(control_rows) < 2:
        found = sorted(set(real_labels))[:10]
        raise ValueError(
            f"control label {control!r} has {len(control_rows)} real cells, need >= 2; pass the "
            f"control label of the real file (labels include {found})."
        )
    real_log, gen_log = log_normalize(real_counts), log_normalize(gen_counts)  # (N, G), (M, G)
    fit_log = real_log if pca_fit_counts is None else log_normalize(pca_fit_counts)
    pca = _fit_pca(fit_log, options.n_pcs, options.seed)
    scores = {"real": pca.transform(real_log), "model": pca.transform(gen_log)}  # (., n_pcs)
    control_log = real_log[control_rows]
    perturbations = sorted(set(real_labels) - {control})
    per_pert: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    means: dict[str, dict[str, np.ndarray]] = {m: {} for m in ("reference", *METHODS)}
    de_rows: list[dict[str, Any]] = []
    all_sides: dict[str, dict[str, np.ndarray]] = {}
    for index, pert in enumerate(perturbations):
        pool = np.flatnonzero((real_labels != control) & (real_labels != pert))
        rng = np.random.default_rng([options.seed, index])
        sides = _sides(
            np.flatnonzero(real_labels == pert),
            np.flatnonzero(gen_labels == pert),
            pool,
            options.max_cells,
            rng,
        )
        if sides is None:
            skipped[pert] = (
                f"fewer than {MIN_CELLS} cells for a side (real {int((real_labels == pert).sum())}"
                f" split in halves, generated {int((gen_labels == pert).sum())}, other "
                f"perturbations {len(pool)})"
            )
            continue
        row, de = _one_perturbation(sides, real_log, gen_log, scores, control_log, options)
        per_pert[pert] = row
        all_sides[pert] = sides
        for side, rows in sides.items():
            source = gen_log if side == "model" else real_log
            means[side][pert] = source[rows].mean(axis=0)
        de_rows.extend(
            {"perturbation": pert, "gene": str(gene), **de[g]} for g, gene in enumerate(genes)
        )
    _add_ranks(per_pert, means)
    params = {
        "control_label": control,
        "n_pcs": int(pca.n_components_),
        "pca_fit_on": f"all {len(real_counts)} compared real cells (in sample)"
        if pca_fit_counts is None
        else f"{len(pca_fit_counts)} real cells outside the comparison (out of sample)",
        "max_cells": options.max_cells,
        "fdr": options.fdr,
        "significance": "two-sided Wilcoxon rank-sum (scipy mannwhitneyu) of the reference half "
        "vs all real control cells on log1p-CP10k, Benjamini-Hochberg FDR < fdr",
        "lfc": f"log2 ratio of mean CP10k, pseudocount {LFC_PSEUDOCOUNT}, vs real control cells",
        "w2_backend": w2_backend(),
        "equal_cells": "every figure compares k reference cells of a perturbation with k cells "
        "of each method, k = min(real cells // 2, generated cells, other perturbations' cells, "
        "max_cells); larger sides are subsampled without replacement with the seed",
        "seed": options.seed,
        "genes": len(genes),
        "real_cells": len(real_counts),
        "generated_cells": len(gen_counts),
    }
    return PerturbationReport(per_pert, skipped, params, de_rows, all_sides)


def _one_perturbation(
    sides: dict[str, np.ndarray],
    real_log: np.ndarray,
    gen_log: np.ndarray,
    scores: dict[str, np.ndarray],
    control_log: np.ndarray,
    options: PerturbationOptions,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One perturbation's metrics per method, and its DE table rows (one per gene)."""
    reference_log = real_log[sides["reference"]]
    reference_pcs = scores["real"][sides["reference"]]
    pvalues, qvalues = de_test(reference_log, control_log)
    significant = qvalues < options.fdr
    real_lfc = log2_fold_change(reference_log, control_log)
    row: dict[str, Any] = {"n_cells_per_side": len(sides["reference"])}
    row["n_significant_genes"] = int(significant.sum())
    lfcs = {}
    for method in METHODS:
        is_model = method == "model"
        candidate_log = (gen_log if is_model else real_log)[sides[method]]
        candidate_pcs = scores["model" if is_model else "real"][sides[method]]
        lfcs[method] = log2_fold_change(candidate_log, control_log)
        row[method] = {
            "w2": w2_distance(candidate_pcs, reference_pcs),
            "mmd2_rbf": mmd2_rbf(candidate_pcs, reference_pcs),
            "frechet": frechet_distance(candidate_pcs, reference_pcs),
            **lfc_recovery(real_lfc[significant], lfcs[method][significant]),
            "rank": None,
        }
    de = [
        {
            "lfc_real": float(real_lfc[g]),
            "pvalue": float(pvalues[g]),
            "fdr": float(qvalues[g]),
            "significant": bool(significant[g]),
            **{f"lfc_{method}": float(lfcs[method][g]) for method in METHODS},
        }
        for g in range(len(real_lfc))
    ]
    return row, de


def _add_ranks(
    per_pert: dict[str, dict[str, Any]], means: dict[str, dict[str, np.ndarray]]
) -> None:
    """Fill each method's ``rank`` (needs >= 2 evaluated perturbations)."""
    names = list(per_pert)
    if len(names) < 2:
        return
    reference = np.stack([means["reference"][p] for p in names])  # (P, G)
    for method in METHODS:
        ranks = normalised_rank(np.stack([means[method][p] for p in names]), reference)
        for name, rank in zip(names, ranks, strict=True):
            per_pert[name][method]["rank"] = float(rank)
