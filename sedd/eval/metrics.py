"""How close are generated cells to real ones: all quality metrics of a comparison.

Every metric compares a real and a generated cells x genes matrix of raw integer counts over the
same genes. Counts are normalised to 1e4 per cell and log1p'd (the field's convention, as in
scanpy and cell-eval) before anything but the zero-fraction and library-size metrics. Pairwise
metrics (MMD, energy, Frechet, kNN AUC) run on a PCA fitted to the real cells, on at most
``max_cells`` cells per side.

``evaluate_counts`` runs them all, overall and per condition. The single metrics live in
``sedd.eval.gene_metrics`` (per-gene metrics and the count-matrix checks) and
``sedd.eval.distances`` (distances between point sets); they are public so other code can use
them on any point sets, and re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse
from sklearn.decomposition import PCA

from sedd.eval.distances import (
    BANDWIDTH_SCALES,
    KNN_FOLDS,
    KNN_NEIGHBORS,
    distribution_metrics,
    energy_distance,
    frechet_distance,
    knn_auc,
    median_bandwidths,
    mmd2_unbiased,
)
from sedd.eval.gene_metrics import (
    TARGET_SUM,
    as_count_matrix,
    correlation_error,
    correlation_matrices,
    correlation_matrix_error,
    gene_correlation_matrix,
    gene_mean_correlation,
    library_size_metrics,
    log_normalize,
    top_variable_genes,
    zero_fraction_metrics,
)

__all__ = [
    "BANDWIDTH_SCALES",
    "KNN_FOLDS",
    "KNN_NEIGHBORS",
    "MIN_GROUP_CELLS",
    "TARGET_SUM",
    "EvaluationArrays",
    "as_count_matrix",
    "correlation_error",
    "distribution_metrics",
    "energy_distance",
    "evaluate_counts",
    "evaluate_counts_with_arrays",
    "fit_real_pca",
    "frechet_distance",
    "gene_correlation_matrix",
    "gene_mean_correlation",
    "knn_auc",
    "library_size_metrics",
    "log_normalize",
    "median_bandwidths",
    "mmd2_unbiased",
    "top_variable_genes",
    "zero_fraction_metrics",
]

# Groups smaller than this on either side get counts only: covariances, kNN folds and MMD
# U-statistics are meaningless on a handful of cells.
MIN_GROUP_CELLS = 5


def fit_real_pca(real_log: np.ndarray, n_pcs: int, seed: int) -> PCA:
    """PCA fitted on real cells, n_components = min(n_pcs, n_cells - 1, n_genes)."""
    n_components = min(n_pcs, real_log.shape[0] - 1, real_log.shape[1])
    return PCA(n_components=n_components, random_state=seed).fit(real_log)


@dataclass(frozen=True)
class EvaluationArrays:
    """Intermediate arrays of the overall comparison, kept for plots."""

    real_gene_means: np.ndarray  # (G,) mean log-normalised expression
    gen_gene_means: np.ndarray  # (G,)
    corr_genes: list[str]  # (K,) top-variable genes on real, most variable first
    real_corr: np.ndarray  # (K, K)
    gen_corr: np.ndarray  # (K, K)
    real_pcs: np.ndarray  # (n_real_pairwise, P) real-fitted PCA scores
    gen_pcs: np.ndarray  # (n_gen_pairwise, P)
    explained_variance_ratio: np.ndarray  # (P,)
    real_pc_labels: np.ndarray | None = None  # (n_real_pairwise,) condition of each real_pcs row
    gen_pc_labels: np.ndarray | None = None  # (n_gen_pairwise,)


def _subsample(n: int, max_cells: int, rng: np.random.Generator) -> np.ndarray:
    if n <= max_cells:
        return np.arange(n)
    return np.sort(rng.choice(n, max_cells, replace=False))


def _evaluate_group(
    real: np.ndarray,
    gen: np.ndarray,
    real_log: np.ndarray,
    gen_log: np.ndarray,
    pca: PCA | None,
    *,
    max_cells: int,
    seed: int,
    top_k: int,
) -> tuple[dict, tuple | None]:
    metrics: dict = {"n_real": len(real), "n_gen": len(gen)}
    if min(len(real), len(gen)) < MIN_GROUP_CELLS:
        metrics["skipped"] = f"fewer than {MIN_GROUP_CELLS} cells on a side: counts only"
        return metrics, None
    metrics |= gene_mean_correlation(real_log, gen_log)
    metrics |= zero_fraction_metrics(real, gen)
    metrics |= library_size_metrics(real, gen)
    genes, real_corr, gen_corr = correlation_matrices(real_log, gen_log, top_k)
    error = correlation_matrix_error(real_corr, gen_corr)
    metrics |= {f"corr_{name}": value for name, value in error.items()}
    if pca is None:
        return metrics, None
    rng = np.random.default_rng(seed)
    real_rows = _subsample(len(real), max_cells, rng)  # the same draws as before, in order
    gen_rows = _subsample(len(gen), max_cells, rng)
    real_pcs = pca.transform(real_log[real_rows])  # (n, P)
    gen_pcs = pca.transform(gen_log[gen_rows])  # (m, P)
    metrics |= {"n_pcs": int(pca.n_components_), "pairwise_n_real": len(real_pcs)}
    metrics["pairwise_n_gen"] = len(gen_pcs)
    metrics |= distribution_metrics(real_pcs, gen_pcs, seed)
    return metrics, (genes, real_corr, gen_corr, real_pcs, gen_pcs, real_rows, gen_rows)


def _labels(conditions: Sequence | None, n_cells: int, name: str) -> np.ndarray | None:
    if conditions is None:
        return None
    labels = np.asarray([str(c) for c in conditions], dtype=object)
    if len(labels) != n_cells:
        raise ValueError(f"{name} has {len(labels)} labels for {n_cells} cells.")
    return labels


def _json_ready(value: Any) -> Any:
    # NaN is not valid JSON: undefined metrics (a constant side) become None.
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _checked_counts(
    real_counts: np.ndarray | sparse.spmatrix,
    gen_counts: np.ndarray | sparse.spmatrix,
    genes: Sequence[str],
    *,
    n_pcs: int,
    max_cells: int,
    top_k_genes: int,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Dense real and generated counts and the gene names, checked to fit together."""
    if n_pcs < 1 or max_cells < MIN_GROUP_CELLS or top_k_genes < 2:
        raise ValueError(
            f"need n_pcs >= 1, max_cells >= {MIN_GROUP_CELLS}, top_k_genes >= 2; got "
            f"n_pcs={n_pcs}, max_cells={max_cells}, top_k_genes={top_k_genes}."
        )
    real, gen = as_count_matrix(real_counts, "real"), as_count_matrix(gen_counts, "generated")
    genes = [str(g) for g in genes]
    if not len(genes) == real.shape[1] == gen.shape[1]:
        raise ValueError(
            f"genes ({len(genes)}), real ({real.shape[1]}) and generated ({gen.shape[1]}) "
            "must have the same number of genes."
        )
    if len(genes) < 2:
        raise ValueError(f"need >= 2 genes to compare, got {len(genes)}.")
    return real, gen, genes


def _condition_labels(
    real_conditions: Sequence | None,
    gen_conditions: Sequence | None,
    real: np.ndarray,
    gen: np.ndarray,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Condition labels as strings, one per real / generated cell; None without labels."""
    if (real_conditions is None) != (gen_conditions is None):
        raise ValueError("give condition labels for both real and generated cells, or neither.")
    real_labels = _labels(real_conditions, len(real), "real_conditions")
    gen_labels = _labels(gen_conditions, len(gen), "gen_conditions")
    return real_labels, gen_labels


def _params(n_genes: int, *, n_pcs: int, max_cells: int, seed: int, top_k: int) -> dict:
    """The settings a result was computed with, as reported under ``"params"``."""
    return {
        "n_genes": n_genes,
        "n_pcs": n_pcs,
        "max_cells": max_cells,
        "seed": seed,
        "top_k_genes": top_k,
        "target_sum": TARGET_SUM,
        "min_group_cells": MIN_GROUP_CELLS,
        "mmd_bandwidth_scales": list(BANDWIDTH_SCALES),
        "knn_neighbors": KNN_NEIGHBORS,
        "knn_folds": KNN_FOLDS,
    }


def _evaluation_arrays(
    views: tuple,
    real_log: np.ndarray,
    gen_log: np.ndarray,
    genes: list[str],
    pca: PCA,
    labels: tuple[np.ndarray | None, np.ndarray | None],
) -> EvaluationArrays:
    """The overall comparison's arrays for plots, from ``_evaluate_group``'s views; ``labels``:
    the conditions of the compared real and generated cells (None without labels)."""
    corr_idx, real_corr, gen_corr, real_pcs, gen_pcs, real_rows, gen_rows = views
    real_labels, gen_labels = labels
    return EvaluationArrays(
        real_gene_means=real_log.mean(axis=0),
        gen_gene_means=gen_log.mean(axis=0),
        corr_genes=[genes[i] for i in corr_idx],
        real_corr=real_corr,
        gen_corr=gen_corr,
        real_pcs=real_pcs,
        gen_pcs=gen_pcs,
        explained_variance_ratio=pca.explained_variance_ratio_,
        real_pc_labels=None if real_labels is None else real_labels[real_rows],
        gen_pc_labels=None if gen_labels is None else gen_labels[gen_rows],
    )


def _shared_conditions(
    real_labels: np.ndarray | None, gen_labels: np.ndarray | None, n_real: int, n_gen: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Conditions present in both sets (sorted) and the real / generated cells in them.

    Without labels: no conditions, and every cell is kept.
    """
    if real_labels is None or gen_labels is None:
        return [], np.ones(n_real, bool), np.ones(n_gen, bool)
    real_set, gen_set = set(real_labels), set(gen_labels)
    shared = sorted(real_set & gen_set)
    if not shared:
        raise ValueError(
            f"no condition is present in both sets: real has {sorted(real_set)[:5]}, "
            f"generated has {sorted(gen_set)[:5]} (first 5 each)."
        )
    return shared, np.isin(real_labels, shared), np.isin(gen_labels, shared)


def _one_sided_conditions(real_labels: np.ndarray, gen_labels: np.ndarray) -> dict[str, dict]:
    """The per-condition entry of each condition present in one set only (sorted)."""
    skipped: dict[str, dict] = {}
    for label in sorted(set(real_labels) ^ set(gen_labels)):
        n_real, n_gen = int((real_labels == label).sum()), int((gen_labels == label).sum())
        side = "real" if n_real else "generated"
        skipped[label] = {"n_real": n_real, "n_gen": n_gen, "skipped": f"only in the {side} set"}
    return skipped


def _fit_comparison_pca(
    compared_real_log: np.ndarray,
    pca_fit_counts: np.ndarray | sparse.spmatrix | None,
    *,
    n_pcs: int,
    max_cells: int,
    seed: int,
) -> tuple[PCA | None, str]:
    """The PCA every group is projected into, and a note on the cells it was fitted to.

    Fitted on ``pca_fit_counts`` when given, else on the compared real cells (log-normalised),
    subsampled to ``max_cells``; None with fewer than ``MIN_GROUP_CELLS`` cells.
    """
    n_genes = compared_real_log.shape[1]
    if pca_fit_counts is None:
        fit_log = compared_real_log
        note = "the compared real cells (in-sample)"
    else:
        fit_log = log_normalize(as_count_matrix(pca_fit_counts, "pca_fit"))
        if fit_log.shape[1] != n_genes or len(fit_log) < MIN_GROUP_CELLS:
            raise ValueError(
                f"pca_fit_counts needs >= {MIN_GROUP_CELLS} cells x {n_genes} genes, got "
                f"{fit_log.shape}."
            )
        note = f"{len(fit_log)} separate real cells (out-of-sample)"
    fit_log = fit_log[_subsample(len(fit_log), max_cells, np.random.default_rng(seed))]
    pca = fit_real_pca(fit_log, n_pcs, seed) if len(fit_log) >= MIN_GROUP_CELLS else None
    return pca, note


def evaluate_counts(
    real_counts: np.ndarray | sparse.spmatrix,
    gen_counts: np.ndarray | sparse.spmatrix,
    genes: Sequence[str],
    *,
    real_conditions: Sequence | None = None,
    gen_conditions: Sequence | None = None,
    n_pcs: int = 50,
    max_cells: int = 2000,
    seed: int = 0,
    top_k_genes: int = 100,
    pca_fit_counts: np.ndarray | sparse.spmatrix | None = None,
) -> dict:
    """All metrics, overall and per condition: {"overall": {...}, "per_condition": {...},
    "params": {...}} (see ``evaluate_counts_with_arrays``)."""
    result, _ = evaluate_counts_with_arrays(
        real_counts,
        gen_counts,
        genes,
        real_conditions=real_conditions,
        gen_conditions=gen_conditions,
        n_pcs=n_pcs,
        max_cells=max_cells,
        seed=seed,
        top_k_genes=top_k_genes,
        pca_fit_counts=pca_fit_counts,
    )
    return result


def evaluate_counts_with_arrays(
    real_counts: np.ndarray | sparse.spmatrix,
    gen_counts: np.ndarray | sparse.spmatrix,
    genes: Sequence[str],
    *,
    real_conditions: Sequence | None = None,
    gen_conditions: Sequence | None = None,
    n_pcs: int = 50,
    max_cells: int = 2000,
    seed: int = 0,
    top_k_genes: int = 100,
    pca_fit_counts: np.ndarray | sparse.spmatrix | None = None,
) -> tuple[dict, EvaluationArrays | None]:
    """Compare generated to real counts (cells x genes, same genes in the same order).

    With condition labels, the overall comparison uses the cells of conditions present in both
    sets; each shared condition is also compared on its own, and conditions present in one set
    only are listed as skipped. The PCA is fitted once, on the overall real cells (subsampled to
    ``max_cells``), and every group is projected into it, so distances are comparable across
    conditions. Fitted on the compared real cells, it holds them in-sample while generated cells
    are projected out-of-sample; with few real cells (hundreds, for 50 PCs) that inflates every
    distance even for a perfect generator. ``pca_fit_counts`` (other real cells, same genes, e.g.
    the training split) fits it on cells outside the comparison instead, removing that bias.
    Groups with fewer than ``MIN_GROUP_CELLS`` cells on a side get counts only.
    Undefined values are None. Also returns the overall arrays for plots (None if skipped).
    """
    options = {"max_cells": max_cells, "seed": seed, "top_k": top_k_genes}
    real, gen, genes = _checked_counts(
        real_counts, gen_counts, genes, n_pcs=n_pcs, max_cells=max_cells, top_k_genes=top_k_genes
    )
    real_labels, gen_labels = _condition_labels(real_conditions, gen_conditions, real, gen)
    real_log, gen_log = log_normalize(real), log_normalize(gen)
    params = _params(len(genes), n_pcs=n_pcs, max_cells=max_cells, seed=seed, top_k=top_k_genes)
    shared, real_keep, gen_keep = _shared_conditions(real_labels, gen_labels, len(real), len(gen))
    if shared:
        params["conditions_shared"] = len(shared)
        params["overall_cells"] = "cells of conditions present in both sets"
    pca, params["pca_fit"] = _fit_comparison_pca(
        real_log[real_keep], pca_fit_counts, n_pcs=n_pcs, max_cells=max_cells, seed=seed
    )
    overall, views = _evaluate_group(
        real[real_keep], gen[gen_keep], real_log[real_keep], gen_log[gen_keep], pca, **options
    )
    per_condition: dict[str, dict] = {}
    for label in shared:
        r, g = real_labels == label, gen_labels == label
        per_condition[label], _ = _evaluate_group(
            real[r], gen[g], real_log[r], gen_log[g], pca, **options
        )
    if real_labels is not None and gen_labels is not None:
        per_condition |= _one_sided_conditions(real_labels, gen_labels)
    arrays = None
    if views is not None and pca is not None:
        compared = (
            None if real_labels is None else real_labels[real_keep],
            None if gen_labels is None else gen_labels[gen_keep],
        )
        arrays = _evaluation_arrays(
            views, real_log[real_keep], gen_log[gen_keep], genes, pca, compared
        )
    result = {"overall": overall, "per_condition": per_condition, "params": params}
    return _json_ready(result), arrays
