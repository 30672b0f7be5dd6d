"""st3's per-perturbation generation metrics and the three files its evaluation writes.

kleonlab/st3 scores generated cells against held-out ones, one perturbation at a time, in
``<st3>/scripts/evals/perturbed_pseq.py`` (branches ``mismatch-flash2`` and
``mismatch-flash-celltype``; the MMD subsample became 100 cells in f57455f, 2026-01-27). This
module recomputes the same numbers and writes the same files, so results line up with the
paper's tables:

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
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sedd.eval.st3_distances import (
    MIN_CELLS,
    MMD_CELLS,
    SEED,
    W2_PROJECTIONS,
    as_matrix,
    check_pair,
    frechet_distance_pca,
    mmd2_rbf_median,
    mmd2_with_rng,
    sliced_w2,
)
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
MMD_NOISE_NOTE = (
    f"note: st3's mmd2_rbf uses at most {MMD_CELLS} cells a side per perturbation, so each value "
    "is noisy; compare the aggregate over many perturbations, not single ones."
)


def perturbation_metrics(
    real: np.ndarray,
    generated: np.ndarray,
    *,
    w2_projections: int = W2_PROJECTIONS,
    mmd_cells: int | None = MMD_CELLS,
    seed: int = SEED,
) -> dict[str, float | int]:
    """One st3 record: ``{"w2", "mmd2_rbf", "fd", "n_real", "n_generated"}`` in that order."""
    real, generated = as_matrix(real, "real"), as_matrix(generated, "generated")
    check_pair(real, generated)
    if mmd_cells is not None and mmd_cells < MIN_CELLS:
        raise ValueError(f"`mmd_cells` must be >= {MIN_CELLS} or None, got {mmd_cells}.")
    w2 = sliced_w2(real, generated, projections=w2_projections, seed=seed)
    # st3 reseeds its global generator for MMD and lets the PCA continue from where MMD left it.
    rng = np.random.RandomState(seed)
    mmd2 = mmd2_with_rng(real, generated, mmd_cells, rng)
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
        real_cells = as_matrix(real_x[real_labels == label], f"real .X ({label})")
        gen_cells = as_matrix(gen_x[gen_labels == label], f"generated .X ({label})")
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
    real: anndata.AnnData, generated: anndata.AnnData, out_dir: str | Path, **options: Any
) -> St3Metrics:
    """``compute_st3_metrics(real, generated, **options)``, then st3's three files written into
    ``out_dir``."""
    metrics = compute_st3_metrics(real, generated, **options)
    metrics.write(out_dir)
    return metrics
