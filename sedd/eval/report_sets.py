"""The cell sets a quality report compares, at equal numbers of cells.

Several of the quality report's figures grow with the number of cells scored: a correlation
matrix from 525 cells is less noisy than one from 105, so its agreement with a reference is
higher (issue 47: the bundled model's within-label agreement read 0.126 from one seed's 105
cells, 0.249 from two seeds' 210 and 0.405 from five seeds' 525), and a share from more cells
lands within a tolerance more often. So every figure is computed on each seed's set alone,
matched to the held-out cells' label mix (as many of each label as the held-out cells have),
beside the held-out cells' figure at their own size, and summarised as mean and sd over seeds:

* ``LabelledCounts``: raw counts and one label a cell;
* ``matched_sample``: rows of a pool in a wanted label mix, drawn without replacement;
* ``seed_sets``: per seed, its generated rows matched to the held-out mix (a set made in that
  mix, as ``sedd quality`` makes them, is kept whole and in order);
* ``over_seeds``: the per-seed values of a figure, their mean and sd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LabelledCounts:
    """Raw counts (N, G) over the report's genes and each cell's label (N,)."""

    counts: np.ndarray
    labels: np.ndarray

    @classmethod
    def of(cls, counts: np.ndarray, labels: Sequence[object]) -> LabelledCounts:
        counts = np.asarray(counts, dtype=np.float64)
        labels = np.asarray([str(x) for x in labels])
        if counts.ndim != 2 or len(counts) != len(labels):
            raise ValueError(f"one label a cell: {len(labels)} labels for counts {counts.shape}.")
        return cls(counts, labels)


def matched_sample(
    pool_labels: np.ndarray, wanted_labels: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Row indices of ``pool_labels``: as many of each label as ``wanted_labels`` has (all of a
    label when the pool has fewer), drawn without replacement, sorted."""
    rows = [np.empty(0, dtype=np.int64)]
    for label, n in zip(*np.unique(wanted_labels, return_counts=True), strict=True):
        pool = np.flatnonzero(pool_labels == label)
        rows.append(rng.choice(pool, min(int(n), len(pool)), replace=False))
    return np.sort(np.concatenate(rows))


def seed_sets(
    gen_labels: np.ndarray, gen_seeds: np.ndarray, held_out_labels: np.ndarray, seed: int = 0
) -> dict[int, np.ndarray]:
    """Seed -> the rows of its generated cells matched to the held-out label mix, seeds in
    ascending order. A seed's set with more cells of a label than the held-out cells have is
    subsampled (with ``seed``); one with fewer keeps all it has, and its size says so."""
    rng = np.random.default_rng(seed)
    out = {}
    for s in np.unique(gen_seeds):
        rows = np.flatnonzero(gen_seeds == s)
        out[int(s)] = rows[matched_sample(gen_labels[rows], held_out_labels, rng)]
    return out


def over_seeds(values: Sequence[float | None], name: str = "generated") -> dict[str, Any]:
    """``{name}_per_seed`` (as given; None where a seed's set had too few cells), ``{name}_mean``
    and ``{name}_sd`` (ddof 1; None below two values) over the seeds that have a value."""
    known = [float(v) for v in values if v is not None]
    return {
        f"{name}_per_seed": list(values),
        f"{name}_mean": float(np.mean(known)) if known else None,
        f"{name}_sd": float(np.std(known, ddof=1)) if len(known) > 1 else None,
    }
