"""The three distances of st3's per-perturbation evaluation, as st3 computes them: sliced W2
(1,000 unit Gaussian directions, seed 42), MMD² with an RBF kernel whose bandwidth is the median
heuristic (at most 100 cells a side), and the Fréchet distance on a PCA fitted on the real
cells (at most 50 components). ``sedd.eval.st3_metrics`` writes them in st3's files."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import linalg
from scipy.spatial.distance import cdist
from sklearn.decomposition import PCA

W2_PROJECTIONS = 1000
MMD_CELLS = 100  # st3's mmd_subsample since 2026-01-27 (2000 before)
BANDWIDTH_CELLS = 100  # cells a side for the median heuristic, whatever MMD_CELLS is
MAX_PCS = 50
FD_EPS = 1e-6
SEED = 42
MIN_CELLS = 2  # a perturbation with fewer real or generated cells is skipped, as in st3
PROJECTION_CHUNK = 100  # directions drawn at a time; bounds memory only


def as_matrix(x: Any, name: str) -> np.ndarray:
    """(cells, genes) dense float; refuses what the metrics cannot use.

    float32 stays float32: st3 hands ``.X`` to sklearn's PCA as stored, and the Frechet distance
    of float32 cells is computed in float32 there (W2 and MMD upcast either way).
    """
    dense = x.toarray() if sp.issparse(x) else np.asarray(x)
    if dense.ndim != 2:
        raise ValueError(f"{name} must be a (cells, genes) matrix, got shape {dense.shape}.")
    if not np.issubdtype(dense.dtype, np.number) and dense.dtype != np.bool_:
        raise ValueError(f"{name} must be numeric, got dtype {dense.dtype}.")
    if dense.dtype not in (np.float32, np.float64):
        dense = dense.astype(np.float64)
    if not np.isfinite(dense).all():
        raise ValueError(f"{name} has NaN or infinite values; st3's metrics need finite .X.")
    return dense


def check_pair(real: np.ndarray, generated: np.ndarray) -> None:
    if real.shape[1] != generated.shape[1]:
        raise ValueError(
            f"real cells have {real.shape[1]} genes and generated cells {generated.shape[1]}; "
            "select the same genes in the same order on both sides first."
        )
    for name, x in (("real", real), ("generated", generated)):
        if x.shape[0] < MIN_CELLS:
            raise ValueError(f"{name} needs >= {MIN_CELLS} cells, got {x.shape[0]}.")


def _resample_sorted(values: np.ndarray, size: int) -> np.ndarray:
    """Sorted values (n,) linearly interpolated at ``size`` evenly spaced ranks -> (size,)."""
    n = values.shape[0]
    if n == size:
        return values
    return np.interp(np.linspace(0.0, n - 1, size), np.arange(n), values)


def sliced_w2(
    real: np.ndarray,
    generated: np.ndarray,
    *,
    projections: int = W2_PROJECTIONS,
    seed: int = SEED,
) -> float:
    """Sliced Wasserstein-2: mean over random unit directions u of
    sqrt(mean_i (sort(real @ u)_i - sort(generated @ u)_i)^2).

    Directions are standard normal draws from ``RandomState(seed)``, one (genes,) row after
    another, normalised to unit length. Unequal set sizes: both sorted projections are resampled
    to the smaller size by linear interpolation over ranks.
    """
    real, generated = as_matrix(real, "real"), as_matrix(generated, "generated")
    check_pair(real, generated)
    if projections < 1:
        raise ValueError(f"`projections` must be >= 1, got {projections}.")
    rng = np.random.RandomState(seed)
    n_genes = real.shape[1]
    size = min(real.shape[0], generated.shape[0])
    per_direction = np.empty(projections)
    for start in range(0, projections, PROJECTION_CHUNK):
        # One draw of (count, genes) is the same stream as `count` draws of (genes,).
        directions = rng.randn(min(PROJECTION_CHUNK, projections - start), n_genes)
        # One direction at a time: a matrix-vector product and 1-D reductions round exactly as
        # st3's loop does (a batched matmul differs in the last bit).
        for offset, direction in enumerate(directions):
            direction = direction / np.sqrt(direction @ direction)
            real_sorted = _resample_sorted(np.sort(real @ direction), size)  # (size,)
            gen_sorted = _resample_sorted(np.sort(generated @ direction), size)  # (size,)
            per_direction[start + offset] = np.sqrt(np.mean((real_sorted - gen_sorted) ** 2))
    return float(np.mean(per_direction))


def _median_gamma(real: np.ndarray, generated: np.ndarray, rng: np.random.RandomState) -> float:
    """gamma = 1 / (2 m^2), m the median positive distance among a fresh draw of up to
    BANDWIDTH_CELLS cells a side; 1.0 when no two of those cells differ."""
    size = min(BANDWIDTH_CELLS, real.shape[0], generated.shape[0])
    pooled = np.vstack(
        [
            real[rng.choice(real.shape[0], size, replace=False)],
            generated[rng.choice(generated.shape[0], size, replace=False)],
        ]
    )
    distances = cdist(pooled, pooled, metric="euclidean")
    positive = distances[distances > 0]
    if positive.size == 0:
        return 1.0
    median = float(np.median(positive))
    return 1.0 / (2.0 * median**2) if median > 0 else 1.0


def mmd2_with_rng(
    real: np.ndarray, generated: np.ndarray, max_cells: int | None, rng: np.random.RandomState
) -> float:
    if max_cells is not None:
        if real.shape[0] > max_cells:
            real = real[rng.choice(real.shape[0], max_cells, replace=False)]
        if generated.shape[0] > max_cells:
            generated = generated[rng.choice(generated.shape[0], max_cells, replace=False)]
    gamma = _median_gamma(real, generated, rng)
    k_rr = np.exp(-gamma * cdist(real, real, metric="sqeuclidean"))
    k_gg = np.exp(-gamma * cdist(generated, generated, metric="sqeuclidean"))
    k_rg = np.exp(-gamma * cdist(real, generated, metric="sqeuclidean"))
    np.fill_diagonal(k_rr, 0.0)  # unbiased within-set means: drop k(x, x)
    np.fill_diagonal(k_gg, 0.0)
    n, m = real.shape[0], generated.shape[0]
    within_real = k_rr.sum() / (n * (n - 1))
    within_gen = k_gg.sum() / (m * (m - 1))
    return float(max(0.0, within_real - 2.0 * k_rg.mean() + within_gen))


def mmd2_rbf_median(
    real: np.ndarray,
    generated: np.ndarray,
    *,
    max_cells: int | None = MMD_CELLS,
    seed: int = SEED,
) -> float:
    """MMD^2 = E k(x, x') - 2 E k(x, y) + E k(y, y'), k(x, y) = exp(-gamma ||x - y||^2).

    ``max_cells`` cells a side at most (``None``: all), drawn without replacement from
    ``RandomState(seed)``, real first; gamma by the median heuristic on a further draw. The
    within-set terms are U-statistics (no diagonal), the cross term a V-statistic; the result is
    clipped at 0, as st3 does.
    """
    real, generated = as_matrix(real, "real"), as_matrix(generated, "generated")
    check_pair(real, generated)
    if max_cells is not None and max_cells < MIN_CELLS:
        raise ValueError(f"`max_cells` must be >= {MIN_CELLS} or None, got {max_cells}.")
    return mmd2_with_rng(real, generated, max_cells, np.random.RandomState(seed))


def _gaussian_fit(points: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    mean = points.mean(axis=0)
    cov = np.atleast_2d(np.cov(points, rowvar=False, ddof=1))  # (k, k), also for k = 1
    return mean, cov + eps * np.eye(cov.shape[0])


def frechet_distance_pca(
    real: np.ndarray,
    generated: np.ndarray,
    *,
    max_pcs: int = MAX_PCS,
    eps: float = FD_EPS,
    random_state: np.random.RandomState | int | None = SEED,
) -> float:
    """||mu_r - mu_g||^2 + tr(S_r + S_g - 2 sqrtm(S_r S_g)) in a PCA fitted to ``real``.

    k = min(max_pcs, n_real - 1, n_generated - 1, genes) components; S = sample covariance
    (ddof 1) + eps I. The square root is scipy's ``sqrtm`` of the product, real part kept, as in
    st3. ``random_state`` only matters when sklearn picks a randomized PCA solver.
    """
    real, generated = as_matrix(real, "real"), as_matrix(generated, "generated")
    check_pair(real, generated)
    if max_pcs < 1:
        raise ValueError(f"`max_pcs` must be >= 1, got {max_pcs}.")
    n_components = min(max_pcs, real.shape[0] - 1, generated.shape[0] - 1, real.shape[1])
    pca = PCA(n_components=n_components, random_state=random_state)
    real_pcs = pca.fit_transform(real)  # (n_real, k)
    gen_pcs = pca.transform(generated)  # (n_gen, k)
    mu_real, cov_real = _gaussian_fit(real_pcs, eps)
    mu_gen, cov_gen = _gaussian_fit(gen_pcs, eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sqrtm's "singular matrix" chatter; checked below
        root = linalg.sqrtm(cov_real @ cov_gen)
    if not np.isfinite(root).all():
        raise ValueError(
            "the Frechet distance's covariance square root is not finite; the cells' values "
            "are too large or degenerate for st3's fd."
        )
    shift = mu_real - mu_gen
    value = shift @ shift + np.trace(cov_real) + np.trace(cov_gen) - 2.0 * np.trace(root.real)
    return float(max(0.0, value))
