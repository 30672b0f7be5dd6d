"""Per-gene quality metrics of generated cells, and the count matrices they take.

``as_count_matrix`` checks that an input holds raw counts (non-negative integers);
``log_normalize`` normalises to ``TARGET_SUM`` per cell and log1p's (the field's convention, as in
scanpy and cell-eval). The metrics compare a real and a generated cells x genes matrix over the
same genes, gene by gene:

* ``gene_mean_correlation``: Pearson and Spearman correlation of per-gene means (log-normalised);
* ``zero_fraction_metrics``, ``library_size_metrics``: on raw counts;
* ``correlation_error``: error of the gene-gene correlation matrix over the most variable genes
  (``correlation_matrices`` and ``correlation_matrix_error`` are its two halves).

``sedd.eval.metrics.evaluate_counts`` runs them with the pairwise distances of
``sedd.eval.distances``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import sparse, stats

__all__ = [
    "METRIC_SCALES",
    "TARGET_SUM",
    "as_count_matrix",
    "correlation_error",
    "correlation_matrices",
    "correlation_matrix_error",
    "gene_correlation_matrix",
    "gene_mean_correlation",
    "library_size_metrics",
    "log_normalize",
    "top_variable_genes",
    "zero_fraction_metrics",
]

TARGET_SUM = 1e4
# The scale of the inputs and of each metric family, recorded in every metrics.json: the
# inputs are raw counts; means, correlations and PCs are on log1p-CP10k (``log_normalize``).
METRIC_SCALES = {
    "input": "counts",
    "gene_means_correlations_and_pcs": "log1p_cp10k",
    "zero_fraction_and_library_size": "counts",
}


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


def _correlation(
    fn: Callable[[np.ndarray, np.ndarray], Any], a: np.ndarray, b: np.ndarray
) -> float:
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


def correlation_matrices(
    real: np.ndarray, gen: np.ndarray, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the top_k genes most variable in ``real``, R_real, R_gen): their Pearson matrices."""
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
    _, real_corr, gen_corr = correlation_matrices(real, gen, top_k)
    return correlation_matrix_error(real_corr, gen_corr)


def correlation_matrix_error(real_corr: np.ndarray, gen_corr: np.ndarray) -> dict[str, float]:
    """rms, mean_abs and n_genes of D = R_gen - R_real (see ``correlation_error``)."""
    diff = gen_corr - real_corr  # (K, K), zero diagonal
    n_off = len(diff) * (len(diff) - 1)
    return {
        "rms": float(np.linalg.norm(diff) / np.sqrt(n_off)),
        "mean_abs": float(np.abs(diff).sum() / n_off),
        "n_genes": len(diff),
    }
