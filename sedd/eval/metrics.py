"""How close are generated cells to real ones: quality metrics on count matrices.

Every metric compares a real and a generated cells x genes matrix of raw integer counts over the
same genes. Counts are normalised to 1e4 per cell and log1p'd (the field's convention, as in
scanpy and cell-eval) before anything but the zero-fraction and library-size metrics. Pairwise
metrics (MMD, energy, Frechet, kNN AUC) run on a PCA fitted to the real cells, on at most
``max_cells`` cells per side.

``evaluate_counts`` runs them all, overall and per condition; the single metrics are public so
other code can use them on any point sets.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import linalg, sparse, stats
from scipy.spatial.distance import cdist, pdist
from sklearn.decomposition import PCA
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.neighbors import KNeighborsClassifier

TARGET_SUM = 1e4
# Groups smaller than this on either side get counts only: covariances, kNN folds and MMD
# U-statistics are meaningless on a handful of cells.
MIN_GROUP_CELLS = 5
BANDWIDTH_SCALES = (0.5, 1.0, 2.0)
KNN_NEIGHBORS = 5
KNN_FOLDS = 5


def as_count_matrix(counts: np.ndarray | sparse.spmatrix, name: str) -> np.ndarray:
    """Dense float64 cells x genes matrix, checked to hold raw counts (non-negative integers)."""
    dense = counts.toarray() if sparse.issparse(counts) else np.asarray(counts)
    if dense.ndim != 2:
        raise ValueError(f"{name} counts must be a 2-D cells x genes matrix, got {dense.shape}.")
    dense = dense.astype(np.float64, copy=False)
    bad = ~np.isfinite(dense) | (dense < 0) | (dense != np.round(dense))
    if bad.any():
        example = dense[bad][0]
        raise ValueError(
            f"{name} counts must be non-negative integers (raw UMI counts), found {example!r} in "
            f"{int(bad.sum())} entries. The metrics normalise to {TARGET_SUM:g} and log1p "
            "themselves: pass raw counts, not log-normalised or scaled data."
        )
    return dense


def log_normalize(counts: np.ndarray, target_sum: float = TARGET_SUM) -> np.ndarray:
    """x_cg = log1p(target_sum * c_cg / sum_g' c_cg'); a cell with no counts stays all zero."""
    counts = np.asarray(counts, dtype=np.float64)  # integer counts are fine too
    totals = counts.sum(axis=1, keepdims=True)  # (N, 1)
    scale = np.divide(target_sum, totals, out=np.zeros_like(totals), where=totals > 0)
    return np.log1p(counts * scale)


def _correlation(fn, a: np.ndarray, b: np.ndarray) -> float:
    # Undefined (not an error) when one side is constant, e.g. a tiny all-zero group.
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(fn(a, b)[0])


def gene_mean_correlation(real_log: np.ndarray, gen_log: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation between per-gene means of log-normalised data.

    m_g = mean_c x_cg on each side; pearson = corr(m_real, m_gen) over genes, spearman the same
    on ranks.
    """
    real_means, gen_means = real_log.mean(axis=0), gen_log.mean(axis=0)  # (G,)
    return {
        "gene_mean_pearson": _correlation(stats.pearsonr, real_means, gen_means),
        "gene_mean_spearman": _correlation(stats.spearmanr, real_means, gen_means),
    }


def zero_fraction_metrics(real_counts: np.ndarray, gen_counts: np.ndarray) -> dict[str, float]:
    """Zero fraction of each side, z = mean_{c,g} [c_cg = 0], and the per-gene error.

    zero_fraction_gene_mae = mean_g |z_g(real) - z_g(gen)| with z_g = mean_c [c_cg = 0].
    """
    real_zero, gen_zero = real_counts == 0, gen_counts == 0
    return {
        "zero_fraction_real": float(real_zero.mean()),
        "zero_fraction_gen": float(gen_zero.mean()),
        "zero_fraction_gene_mae": float(np.abs(real_zero.mean(0) - gen_zero.mean(0)).mean()),
    }


def library_size_metrics(real_counts: np.ndarray, gen_counts: np.ndarray) -> dict[str, float]:
    """Library size L_c = sum_g c_cg (raw): mean and median per side, and the two-sample KS
    statistic sup_l |F_real(l) - F_gen(l)| between the library-size distributions."""
    real_lib, gen_lib = real_counts.sum(axis=1), gen_counts.sum(axis=1)  # (N,)
    ks = stats.ks_2samp(real_lib, gen_lib)
    return {
        "library_size_mean_real": float(real_lib.mean()),
        "library_size_mean_gen": float(gen_lib.mean()),
        "library_size_median_real": float(np.median(real_lib)),
        "library_size_median_gen": float(np.median(gen_lib)),
        "library_size_ks": float(ks.statistic),
        "library_size_ks_pvalue": float(ks.pvalue),
    }


def top_variable_genes(log_data: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k genes with the largest variance, most variable first."""
    return np.argsort(-log_data.var(axis=0), kind="stable")[:k]


def gene_correlation_matrix(x: np.ndarray) -> np.ndarray:
    """Pearson r_ij = cov(x_i, x_j) / (sd_i sd_j) over cells for a cells x genes matrix.

    A constant gene has no defined correlation; it gets r = 0 with every other gene (and 1 on
    the diagonal), which counts its absence of co-variation as error against a varying gene.
    """
    centered = x - x.mean(axis=0)  # (N, K)
    norms = np.sqrt((centered**2).sum(axis=0))  # (K,)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (centered.T @ centered) / np.outer(norms, norms)  # (K, K)
    corr = np.clip(np.where(np.isfinite(corr), corr, 0.0), -1.0, 1.0)
    np.fill_diagonal(corr, 1.0)
    return corr


def _correlation_pair(
    real: np.ndarray, gen: np.ndarray, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if real.shape[1] != gen.shape[1]:
        raise ValueError(f"real and gen need the same genes, got {real.shape} and {gen.shape}.")
    genes = top_variable_genes(real, top_k)
    if len(genes) < 2:
        raise ValueError(f"gene-gene correlation needs >= 2 genes, got {len(genes)}.")
    return genes, gene_correlation_matrix(real[:, genes]), gene_correlation_matrix(gen[:, genes])


def correlation_error(real: np.ndarray, gen: np.ndarray, top_k: int = 100) -> dict[str, float]:
    """Error of the gene-gene correlation matrix over the top_k genes most variable in ``real``.

    D = R_gen - R_real (Pearson, K x K, cells x genes inputs, usually log-normalised);
    rms = ||D||_F / sqrt(K(K-1)), the RMS over off-diagonal entries (the diagonal of D is 0);
    mean_abs = sum_{i != j} |D_ij| / (K(K-1)).
    """
    _, real_corr, gen_corr = _correlation_pair(real, gen, top_k)
    return _correlation_matrix_error(real_corr, gen_corr)


def _correlation_matrix_error(real_corr: np.ndarray, gen_corr: np.ndarray) -> dict[str, float]:
    diff = gen_corr - real_corr  # (K, K), zero diagonal
    n_off = len(diff) * (len(diff) - 1)
    return {
        "rms": float(np.linalg.norm(diff) / np.sqrt(n_off)),
        "mean_abs": float(np.abs(diff).sum() / n_off),
        "n_genes": len(diff),
    }


def _points(x: np.ndarray, name: str, minimum: int = 2) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < minimum:
        raise ValueError(f"{name} must be an (n, d) array with n >= {minimum}, got {x.shape}.")
    return x


def median_bandwidths(
    x: np.ndarray, y: np.ndarray, scales: Sequence[float] = BANDWIDTH_SCALES
) -> tuple[float, ...]:
    """h = median pairwise Euclidean distance of the pooled sample x each scale (median
    heuristic); falls back to the median positive distance, then 1, for degenerate samples."""
    dist = pdist(np.vstack([x, y]))
    median = float(np.median(dist)) if dist.size else 0.0
    if median <= 0:
        positive = dist[dist > 0]
        median = float(np.median(positive)) if positive.size else 1.0
    return tuple(median * s for s in scales)


def mmd2_unbiased(x: np.ndarray, y: np.ndarray, bandwidths: Sequence[float] | None = None) -> float:
    """Unbiased squared maximum mean discrepancy with a multi-bandwidth RBF kernel.

    k(a, b) = sum_h exp(-|a - b|^2 / (2 h^2)), h in ``bandwidths`` (default: median pairwise
    distance of the pooled sample x {0.5, 1, 2}).
    MMD^2 = 1/(m(m-1)) sum_{i!=j} k(x_i, x_j) + 1/(n(n-1)) sum_{i!=j} k(y_i, y_j)
            - 2/(mn) sum_{i,j} k(x_i, y_j).
    The U-statistic drops the diagonal, so it is unbiased and can be slightly negative when the
    two distributions are equal.
    """
    x, y = _points(x, "x"), _points(y, "y")
    if bandwidths is None:
        bandwidths = median_bandwidths(x, y)
    if len(bandwidths) == 0 or min(bandwidths) <= 0:
        raise ValueError(f"bandwidths must be positive, got {tuple(bandwidths)}.")

    def kernel(sq_dist: np.ndarray) -> np.ndarray:
        return sum(np.exp(-sq_dist / (2.0 * h * h)) for h in bandwidths)

    m, n = len(x), len(y)
    k_xx = kernel(cdist(x, x, "sqeuclidean"))  # (m, m)
    k_yy = kernel(cdist(y, y, "sqeuclidean"))  # (n, n)
    k_xy = kernel(cdist(x, y, "sqeuclidean"))  # (m, n)
    within_x = (k_xx.sum() - np.trace(k_xx)) / (m * (m - 1))
    within_y = (k_yy.sum() - np.trace(k_yy)) / (n * (n - 1))
    return float(within_x + within_y - 2.0 * k_xy.mean())


def energy_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Energy distance E = 2 E|X - Y| - E|X - X'| - E|Y - Y'| (Euclidean norms).

    Each expectation is the mean over all pairs, self-pairs included (the V-statistic), so
    E >= 0 and E = 0 exactly for identical point sets.
    """
    x, y = _points(x, "x", 1), _points(y, "y", 1)
    return float(2.0 * cdist(x, y).mean() - cdist(x, x).mean() - cdist(y, y).mean())


def _sqrtm_real(a: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        # sqrtm warns on singular input (rank-deficient covariances); the caller checks finiteness.
        warnings.simplefilter("ignore")
        return np.real(linalg.sqrtm(a))


def frechet_distance(x: np.ndarray, y: np.ndarray, eps: float = 1e-6) -> float:
    """Frechet distance between Gaussians fitted to x and y (as FID, on any features).

    FD = |mu_x - mu_y|^2 + Tr(S_x + S_y - 2 (S_x S_y)^{1/2}) with sample means and covariances
    (ddof = 1). The matrix square root is scipy.linalg.sqrtm, real part kept (imaginary parts
    are round-off); if it is not finite, eps * I is added to both covariances.
    """
    x, y = _points(x, "x"), _points(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y need the same dimension, got {x.shape} and {y.shape}.")
    mean_diff = x.mean(axis=0) - y.mean(axis=0)  # (D,)
    cov_x = np.atleast_2d(np.cov(x, rowvar=False))  # (D, D)
    cov_y = np.atleast_2d(np.cov(y, rowvar=False))
    cov_sqrt = _sqrtm_real(cov_x @ cov_y)
    if not np.isfinite(cov_sqrt).all():
        offset = eps * np.eye(len(cov_x))
        cov_sqrt = _sqrtm_real((cov_x + offset) @ (cov_y + offset))
    trace = np.trace(cov_x) + np.trace(cov_y) - 2.0 * np.trace(cov_sqrt)
    return float(mean_diff @ mean_diff + trace)


def knn_auc(
    x: np.ndarray,
    y: np.ndarray,
    seed: int = 0,
    n_neighbors: int = KNN_NEIGHBORS,
    n_folds: int = KNN_FOLDS,
) -> float:
    """Cross-validated ROC AUC of a kNN classifier telling x (real, 0) from y (generated, 1).

    Both sides are subsampled (with ``seed``) to n = min(len(x), len(y)) so the classes are
    balanced; StratifiedKFold(n_folds, shuffled with ``seed``) gives every point an
    out-of-fold P(generated) from KNeighborsClassifier(n_neighbors) fitted on the other folds;
    AUC = P(score of a random y point > score of a random x point) over those predictions.
    0.5: indistinguishable (ideal); 1.0: perfectly separable.
    """
    x, y = _points(x, "x", n_folds), _points(y, "y", n_folds)
    rng = np.random.default_rng(seed)
    n = min(len(x), len(y))
    points = np.vstack(
        [x[rng.choice(len(x), n, replace=False)], y[rng.choice(len(y), n, replace=False)]]
    )  # (2n, D)
    labels = np.repeat([0, 1], n)
    # A training split holds at least 2n - 2 ceil(n / n_folds) points; k cannot exceed it.
    k = min(n_neighbors, 2 * n - 2 * -(-n // n_folds))
    folds = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    proba = cross_val_predict(
        KNeighborsClassifier(n_neighbors=k), points, labels, cv=folds, method="predict_proba"
    )
    return float(roc_auc_score(labels, proba[:, 1]))


def fit_real_pca(real_log: np.ndarray, n_pcs: int, seed: int) -> PCA:
    """PCA fitted on real cells, n_components = min(n_pcs, n_cells - 1, n_genes)."""
    n_components = min(n_pcs, real_log.shape[0] - 1, real_log.shape[1])
    return PCA(n_components=n_components, random_state=seed).fit(real_log)


def distribution_metrics(real_pcs: np.ndarray, gen_pcs: np.ndarray, seed: int) -> dict:
    """MMD^2, energy, Frechet distance and kNN AUC between two point sets (e.g. PCA scores)."""
    return {
        "mmd2_rbf": mmd2_unbiased(real_pcs, gen_pcs),
        "energy_distance": energy_distance(real_pcs, gen_pcs),
        "frechet_distance": frechet_distance(real_pcs, gen_pcs),
        "knn_auc": knn_auc(real_pcs, gen_pcs, seed),
    }


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
    genes, real_corr, gen_corr = _correlation_pair(real_log, gen_log, top_k)
    error = _correlation_matrix_error(real_corr, gen_corr)
    metrics |= {f"corr_{name}": value for name, value in error.items()}
    if pca is None:
        return metrics, None
    rng = np.random.default_rng(seed)
    real_pcs = pca.transform(real_log[_subsample(len(real), max_cells, rng)])  # (n, P)
    gen_pcs = pca.transform(gen_log[_subsample(len(gen), max_cells, rng)])  # (m, P)
    metrics |= {"n_pcs": int(pca.n_components_), "pairwise_n_real": len(real_pcs)}
    metrics["pairwise_n_gen"] = len(gen_pcs)
    metrics |= distribution_metrics(real_pcs, gen_pcs, seed)
    return metrics, (genes, real_corr, gen_corr, real_pcs, gen_pcs)


def _labels(conditions: Sequence | None, n_cells: int, name: str) -> np.ndarray | None:
    if conditions is None:
        return None
    labels = np.asarray([str(c) for c in conditions], dtype=object)
    if len(labels) != n_cells:
        raise ValueError(f"{name} has {len(labels)} labels for {n_cells} cells.")
    return labels


def _json_ready(value):
    # NaN is not valid JSON: undefined metrics (a constant side) become None.
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


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
    if (real_conditions is None) != (gen_conditions is None):
        raise ValueError("give condition labels for both real and generated cells, or neither.")
    real_labels = _labels(real_conditions, len(real), "real_conditions")
    gen_labels = _labels(gen_conditions, len(gen), "gen_conditions")
    real_log, gen_log = log_normalize(real), log_normalize(gen)

    params: dict = {
        "n_genes": len(genes),
        "n_pcs": n_pcs,
        "max_cells": max_cells,
        "seed": seed,
        "top_k_genes": top_k_genes,
        "target_sum": TARGET_SUM,
        "min_group_cells": MIN_GROUP_CELLS,
        "mmd_bandwidth_scales": list(BANDWIDTH_SCALES),
        "knn_neighbors": KNN_NEIGHBORS,
        "knn_folds": KNN_FOLDS,
    }
    real_keep, gen_keep = np.ones(len(real), bool), np.ones(len(gen), bool)
    shared: list[str] = []
    per_condition: dict[str, dict] = {}
    if real_labels is not None:
        real_set, gen_set = set(real_labels), set(gen_labels)
        shared = sorted(real_set & gen_set)
        if not shared:
            raise ValueError(
                f"no condition is present in both sets: real has {sorted(real_set)[:5]}, "
                f"generated has {sorted(gen_set)[:5]} (first 5 each)."
            )
        real_keep, gen_keep = np.isin(real_labels, shared), np.isin(gen_labels, shared)
        params["conditions_shared"] = len(shared)
        params["overall_cells"] = "cells of conditions present in both sets"

    if pca_fit_counts is None:
        fit_log = real_log[real_keep]
        params["pca_fit"] = "the compared real cells (in-sample)"
    else:
        fit_log = log_normalize(as_count_matrix(pca_fit_counts, "pca_fit"))
        if fit_log.shape[1] != len(genes) or len(fit_log) < MIN_GROUP_CELLS:
            raise ValueError(
                f"pca_fit_counts needs >= {MIN_GROUP_CELLS} cells x {len(genes)} genes, got "
                f"{fit_log.shape}."
            )
        params["pca_fit"] = f"{len(fit_log)} separate real cells (out-of-sample)"
    fit_log = fit_log[_subsample(len(fit_log), max_cells, np.random.default_rng(seed))]
    pca = fit_real_pca(fit_log, n_pcs, seed) if len(fit_log) >= MIN_GROUP_CELLS else None
    options = {"max_cells": max_cells, "seed": seed, "top_k": top_k_genes}
    overall, views = _evaluate_group(
        real[real_keep], gen[gen_keep], real_log[real_keep], gen_log[gen_keep], pca, **options
    )
    for label in shared:
        r, g = real_labels == label, gen_labels == label
        per_condition[label], _ = _evaluate_group(
            real[r], gen[g], real_log[r], gen_log[g], pca, **options
        )
    if real_labels is not None:
        for label in sorted(set(real_labels) ^ set(gen_labels)):
            n_real, n_gen = int((real_labels == label).sum()), int((gen_labels == label).sum())
            side = "real" if n_real else "generated"
            per_condition[label] = {
                "n_real": n_real,
                "n_gen": n_gen,
                "skipped": f"only in the {side} set",
            }

    arrays = None
    if views is not None:
        corr_idx, real_corr, gen_corr, real_pcs, gen_pcs = views
        arrays = EvaluationArrays(
            real_gene_means=real_log[real_keep].mean(axis=0),
            gen_gene_means=gen_log[gen_keep].mean(axis=0),
            corr_genes=[genes[i] for i in corr_idx],
            real_corr=real_corr,
            gen_corr=gen_corr,
            real_pcs=real_pcs,
            gen_pcs=gen_pcs,
            explained_variance_ratio=pca.explained_variance_ratio_,
        )
    result = {"overall": overall, "per_condition": per_condition, "params": params}
    return _json_ready(result), arrays
