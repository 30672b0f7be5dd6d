"""Distances between two point sets: how far apart are real and generated cells as a whole.

Each metric takes two (n, d) arrays of points, e.g. PCA scores of log-normalised cells
(``sedd.eval.metrics`` projects real and generated cells into a PCA fitted to real cells first),
and works on any features:

* ``mmd2_unbiased``: squared maximum mean discrepancy, multi-bandwidth RBF kernel (U-statistic);
* ``energy_distance``: the energy distance (V-statistic);
* ``frechet_distance``: the Frechet distance between fitted Gaussians, as FID;
* ``knn_auc``: cross-validated ROC AUC of a kNN classifier telling the sets apart.

``distribution_metrics`` runs all four.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist, pdist
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.neighbors import KNeighborsClassifier

__all__ = [
    "BANDWIDTH_SCALES",
    "KNN_FOLDS",
    "KNN_NEIGHBORS",
    "distribution_metrics",
    "energy_distance",
    "frechet_distance",
    "knn_auc",
    "median_bandwidths",
    "mmd2_unbiased",
]

BANDWIDTH_SCALES = (0.5, 1.0, 2.0)
KNN_NEIGHBORS = 5
KNN_FOLDS = 5


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


def distribution_metrics(real_pcs: np.ndarray, gen_pcs: np.ndarray, seed: int) -> dict:
    """MMD^2, energy, Frechet distance and kNN AUC between two point sets (e.g. PCA scores)."""
    return {
        "mmd2_rbf": mmd2_unbiased(real_pcs, gen_pcs),
        "energy_distance": energy_distance(real_pcs, gen_pcs),
        "frechet_distance": frechet_distance(real_pcs, gen_pcs),
        "knn_auc": knn_auc(real_pcs, gen_pcs, seed),
    }
