"""st3's per-perturbation generation metrics and the three files its evaluation writes.

kleonlab/st3 scores generated cells against held-out ones, one perturbation at a time, in
``scripts/evals/perturbed_pseq.py`` (branches ``mismatch-flash2`` and ``mismatch-flash-celltype``;
the MMD subsample became 100 cells in f57455f, 2026-01-27). This module recomputes the same
numbers and writes the same files, so results line up with the paper's tables:

* ``generation_metrics_per_perturbation.json``: ``{perturbation: {"w2", "mmd2_rbf", "fd",
  "n_real", "n_generated"}}``, perturbations in sorted order;
* ``generation_metrics_per_perturbation.csv``: the same records, one row each, index column
  ``perturbation``, rows sorted by ``w2``;
* ``generation_metrics_aggregate.json``: ``{"w2" | "mmd2_rbf" | "fd": {"mean", "median", "std",
  "min", "max"}, "num_perturbations": n}``.

The metrics, on ``.X`` exactly as stored (st3 neither normalises nor log-transforms, and matches
genes by column position, not by name), for each perturbation present in both files with at least
2 cells on each side:

* ``w2``: sliced Wasserstein-2, the mean over 1,000 random unit directions (Gaussian draws, seed
  42) of the 1-D W2 between the sorted projections; when the two sides have different sizes,
  both sorted projections are linearly resampled to the smaller size;
* ``mmd2_rbf``: MMD^2 with the kernel exp(-gamma ||x - y||^2), at most 100 cells a side (drawn
  without replacement, seed 42), gamma = 1 / (2 m^2) with m the median positive Euclidean
  distance among up to 100 + 100 further-drawn cells; within-set terms exclude the diagonal
  (unbiased), the cross term is the plain mean; clipped at 0;
* ``fd``: Frechet distance between Gaussians fitted in a PCA of the real cells with
  min(50, n_real - 1, n_generated - 1, genes) components, covariances with ddof 1 plus 1e-6 I;
  clipped at 0.

Randomness follows st3's draw order on a legacy ``numpy.random.RandomState``: W2 starts one at
``seed``; MMD starts another at ``seed`` and, as st3's global generator did, hands its state on to
the PCA (which draws only with sklearn's randomized or ARPACK solvers).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import linalg
from scipy.spatial.distance import cdist
from sklearn.decomposition import PCA

from sedd.io.files import write_bytes_atomic

if TYPE_CHECKING:
    import anndata

__all__ = [
    "AGGREGATE_JSON",
    "MIN_CELLS",
    "MMD_NOISE_NOTE",
    "PER_PERTURBATION_CSV",
    "PER_PERTURBATION_JSON",
    "St3Metrics",
    "compute_st3_metrics",
    "frechet_distance_pca",
    "mmd2_rbf_median",
    "perturbation_metrics",
    "sliced_w2",
    "write_st3_metric_files",
]

PER_PERTURBATION_JSON = "generation_metrics_per_perturbation.json"
PER_PERTURBATION_CSV = "generation_metrics_per_perturbation.csv"
AGGREGATE_JSON = "generation_metrics_aggregate.json"

METRICS = ("w2", "mmd2_rbf", "fd")  # also the key order of each record and of the aggregate
STATISTICS = ("mean", "median", "std", "min", "max")
W2_PROJECTIONS = 1000
MMD_CELLS = 100  # st3's mmd_subsample since 2026-01-27 (2000 before)
BANDWIDTH_CELLS = 100  # cells a side for the median heuristic, whatever MMD_CELLS is
MAX_PCS = 50
FD_EPS = 1e-6
SEED = 42
MIN_CELLS = 2  # a perturbation with fewer real or generated cells is skipped, as in st3
PROJECTION_CHUNK = 100  # directions drawn at a time; bounds memory only

MMD_NOISE_NOTE = (
    f"note: st3's mmd2_rbf uses at most {MMD_CELLS} cells a side per perturbation, so each value "
    "is noisy; compare the aggregate over many perturbations, not single ones."
)


def _matrix(x: Any, name: str) -> np.ndarray:
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


def _check_pair(real: np.ndarray, generated: np.ndarray) -> None:
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
    real, generated = _matrix(real, "real"), _matrix(generated, "generated")
    _check_pair(real, generated)
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


def _mmd2_with_rng(
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
    real, generated = _matrix(real, "real"), _matrix(generated, "generated")
    _check_pair(real, generated)
    if max_cells is not None and max_cells < MIN_CELLS:
        raise ValueError(f"`max_cells` must be >= {MIN_CELLS} or None, got {max_cells}.")
    return _mmd2_with_rng(real, generated, max_cells, np.random.RandomState(seed))


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
    real, generated = _matrix(real, "real"), _matrix(generated, "generated")
    _check_pair(real, generated)
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


def perturbation_metrics(
    real: np.ndarray,
    generated: np.ndarray,
    *,
    w2_projections: int = W2_PROJECTIONS,
    mmd_cells: int | None = MMD_CELLS,
    seed: int = SEED,
) -> dict[str, float | int]:
    """One st3 record: ``{"w2", "mmd2_rbf", "fd", "n_real", "n_generated"}`` in that order."""
    real, generated = _matrix(real, "real"), _matrix(generated, "generated")
    _check_pair(real, generated)
    if mmd_cells is not None and mmd_cells < MIN_CELLS:
        raise ValueError(f"`mmd_cells` must be >= {MIN_CELLS} or None, got {mmd_cells}.")
    w2 = sliced_w2(real, generated, projections=w2_projections, seed=seed)
    # st3 reseeds its global generator for MMD and lets the PCA continue from where MMD left it.
    rng = np.random.RandomState(seed)
    mmd2 = _mmd2_with_rng(real, generated, mmd_cells, rng)
    fd = frechet_distance_pca(real, generated, random_state=rng)
    return {
        "w2": w2,
        "mmd2_rbf": mmd2,
        "fd": fd,
        "n_real": int(real.shape[0]),
        "n_generated": int(generated.shape[0]),
    }


def _aggregate(per_perturbation: dict[Hashable, dict[str, float | int]]) -> dict[str, Any]:
    """st3's aggregate: per metric mean/median/std (population)/min/max, then the count."""
    if not per_perturbation:
        return {}
    summary: dict[str, Any] = {}
    for metric in METRICS:
        values = np.array([record[metric] for record in per_perturbation.values()])
        summary[metric] = {
            "mean": float(np.mean(values)),
            "median": float(np.median(values)),
            "std": float(np.std(values)),
            "min": float(np.min(values)),
            "max": float(np.max(values)),
        }
    summary["num_perturbations"] = len(per_perturbation)
    return summary


@dataclass
class St3Metrics:
    """What st3's evaluation writes, plus which shared perturbations were skipped (< 2 cells)."""

    per_perturbation: dict[Hashable, dict[str, float | int]]
    aggregate: dict[str, Any]
    skipped: list[Hashable] = field(default_factory=list)

    def per_perturbation_csv(self) -> str:
        """The CSV text: index column ``perturbation``, st3's record columns, sorted by ``w2``."""
        frame = pd.DataFrame.from_dict(self.per_perturbation, orient="index")
        frame.index.name = "perturbation"
        return frame.sort_values("w2").to_csv()

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write the three files into ``out_dir`` (created if missing); their paths."""
        out_dir = Path(out_dir)
        files = [
            (out_dir / PER_PERTURBATION_JSON, json.dumps(self.per_perturbation, indent=2)),
            (out_dir / AGGREGATE_JSON, json.dumps(self.aggregate, indent=2)),
            (out_dir / PER_PERTURBATION_CSV, self.per_perturbation_csv()),
        ]
        for path, text in files:  # json.dump in st3: indent 2, no final newline
            write_bytes_atomic(path, text.encode())
        return [path for path, _ in files]


def _labels(adata: anndata.AnnData, key: str, which: str) -> np.ndarray:
    if key not in adata.obs.columns:
        raise ValueError(
            f"{which} perturbation column {key!r} is not an obs column; available: "
            f"{list(adata.obs.columns)}."
        )
    return adata.obs[key].to_numpy(dtype=object)


def _present(labels: np.ndarray) -> set[Hashable]:
    return {label for label in labels if not (isinstance(label, float) and math.isnan(label))}


def compute_st3_metrics(
    real: anndata.AnnData,
    generated: anndata.AnnData,
    *,
    real_key: str = "gene",
    generated_key: str = "perturbation",
    w2_projections: int = W2_PROJECTIONS,
    mmd_cells: int | None = MMD_CELLS,
    seed: int = SEED,
) -> St3Metrics:
    """st3's per-perturbation metrics of ``generated`` against ``real``.

    Columns of ``.X`` are compared by position (select the same genes in the same order first).
    Perturbations are the labels in both ``real.obs[real_key]`` and
    ``generated.obs[generated_key]`` (missing labels ignored), in sorted order; one with fewer
    than 2 cells on either side is skipped and listed in ``skipped``. Defaults are st3's.
    """
    if real.n_vars != generated.n_vars:
        raise ValueError(
            f"real has {real.n_vars} genes and generated {generated.n_vars}; st3 compares .X "
            "columns by position, so select the same genes in the same order on both sides."
        )
    real_labels = _labels(real, real_key, "real")
    gen_labels = _labels(generated, generated_key, "generated")
    shared = _present(real_labels) & _present(gen_labels)
    if not shared:
        raise ValueError(
            f"no perturbation label is in both real obs[{real_key!r}] and generated "
            f"obs[{generated_key!r}]; pass the columns that hold the same perturbation names."
        )
    try:
        order = sorted(shared)
    except TypeError as exc:
        raise ValueError(
            f"the perturbation labels mix types ({sorted({type(x).__name__ for x in shared})}); "
            "make the label columns strings."
        ) from exc
    # Densified a perturbation at a time: a sparse .X of many cells never becomes dense whole.
    real_x, gen_x = real.X, generated.X
    per_perturbation: dict[Hashable, dict[str, float | int]] = {}
    skipped: list[Hashable] = []
    for label in order:
        real_cells = _matrix(real_x[real_labels == label], f"real .X ({label})")
        gen_cells = _matrix(gen_x[gen_labels == label], f"generated .X ({label})")
        if real_cells.shape[0] < MIN_CELLS or gen_cells.shape[0] < MIN_CELLS:
            skipped.append(label)
            continue
        per_perturbation[label] = perturbation_metrics(
            real_cells,
            gen_cells,
            w2_projections=w2_projections,
            mmd_cells=mmd_cells,
            seed=seed,
        )
    if not per_perturbation:
        raise ValueError(
            f"none of the {len(order)} shared perturbations has >= {MIN_CELLS} real and "
            f">= {MIN_CELLS} generated cells; st3's metrics need at least that many."
        )
    return St3Metrics(per_perturbation, _aggregate(per_perturbation), skipped)


def write_st3_metric_files(
    real: anndata.AnnData,
    generated: anndata.AnnData,
    out_dir: str | Path,
    *,
    real_key: str = "gene",
    generated_key: str = "perturbation",
    w2_projections: int = W2_PROJECTIONS,
    mmd_cells: int | None = MMD_CELLS,
    seed: int = SEED,
) -> St3Metrics:
    """``compute_st3_metrics`` then write st3's three files into ``out_dir``."""
    metrics = compute_st3_metrics(
        real,
        generated,
        real_key=real_key,
        generated_key=generated_key,
        w2_projections=w2_projections,
        mmd_cells=mmd_cells,
        seed=seed,
    )
    metrics.write(out_dir)
    return metrics
