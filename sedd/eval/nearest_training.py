"""What a generated set's nearest real training cells say about it, in a PCA space.

* ``label_knn_accuracy``: a kNN classifier fitted on the training cells predicts each cell's
  label; a generated cell that looks like its label scores like a held-out real cell does.
* ``memorisation_guard``: each generated cell's distance to its nearest training cell against
  the held-out real cells' distances to the training set. A generator that copies its training
  cells puts many cells closer than almost every held-out cell (the held-out 5th percentile);
  one that learned the distribution puts about 5% there. Exact copies of a training cell's
  counts are counted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

LABEL_NEIGHBOURS = 10  # neighbours voting on a cell's label
GUARD_PERCENTILE = 5.0  # "closer than the held-out 5th percentile"
# Share of generated cells below the held-out 5th percentile above which the guard trips: about
# 5% is expected, and 105 held-out cells set that percentile from ~5 cells, so allow 3x.
GUARD_LIMIT = 0.15


def label_knn_accuracy(
    train_pcs: np.ndarray,
    train_labels: Sequence[str],
    pcs: np.ndarray,
    labels: Sequence[str],
    *,
    n_neighbors: int = LABEL_NEIGHBOURS,
) -> dict[str, Any]:
    """Accuracy of a kNN classifier (``n_neighbors``, uniform vote) fitted on the training
    cells' (M, P) scores and labels at predicting the labels of (N, P) ``pcs``: overall and per
    label (the share of that label's cells predicted as it)."""
    train_labels, labels = np.asarray(train_labels, str), np.asarray(labels, str)
    if len(pcs) == 0 or len(pcs) != len(labels):
        raise ValueError(f"need one label a cell and >= 1 cell, got {len(labels)} for {len(pcs)}.")
    k = min(n_neighbors, len(train_pcs))
    predicted = KNeighborsClassifier(n_neighbors=k).fit(train_pcs, train_labels).predict(pcs)
    correct = predicted == labels
    return {
        "accuracy": float(correct.mean()),
        "n_neighbors": k,
        "per_label": {str(x): float(correct[labels == x].mean()) for x in np.unique(labels)},
    }


def nearest_training_distances(train_pcs: np.ndarray, pcs: np.ndarray) -> np.ndarray:
    """(N,) Euclidean distance of each row of ``pcs`` to its nearest row of ``train_pcs``."""
    distances, _ = NearestNeighbors(n_neighbors=1).fit(train_pcs).kneighbors(pcs)
    return distances[:, 0]


def exact_copies(train_counts: np.ndarray, counts: np.ndarray) -> int:
    """How many rows of ``counts`` equal some row of ``train_counts`` exactly (same genes)."""
    train_counts = np.ascontiguousarray(train_counts, dtype=np.float64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    by_hash: dict[int, list[int]] = {}  # a hash a row, so no copy of the rows is kept
    for i, row in enumerate(train_counts):
        by_hash.setdefault(hash(row.tobytes()), []).append(i)
    return sum(
        any(np.array_equal(train_counts[i], row) for i in by_hash.get(hash(row.tobytes()), ()))
        for row in counts
    )


def memorisation_guard(
    train_pcs: np.ndarray,
    held_out_pcs: np.ndarray,
    gen_pcs: np.ndarray,
    *,
    train_counts: np.ndarray | None = None,
    gen_counts: np.ndarray | None = None,
    limit: float = GUARD_LIMIT,
) -> dict[str, Any]:
    """Nearest-training-cell distances of generated and held-out cells, and a verdict.

    ``closer_than_held_out_p5``: the share of generated cells nearer to a training cell than the
    held-out cells' 5th percentile (about 0.05 for a generator that learned the distribution).
    The guard trips (``memorising``) above ``limit``, or when a generated cell repeats a
    training cell's counts exactly (``exact_copies``, counted when both count matrices are
    given)."""
    held = nearest_training_distances(train_pcs, held_out_pcs)
    gen = nearest_training_distances(train_pcs, gen_pcs)
    threshold = float(np.percentile(held, GUARD_PERCENTILE))
    closer = float(np.mean(gen < threshold))
    copies = None
    if train_counts is not None and gen_counts is not None:
        copies = exact_copies(train_counts, gen_counts)
    memorising = closer > limit or bool(copies)
    return {
        "held_out_median": float(np.median(held)),
        "held_out_p5": threshold,
        "generated_median": float(np.median(gen)),
        "generated_p5": float(np.percentile(gen, GUARD_PERCENTILE)),
        "closer_than_held_out_p5": closer,
        "expected_share": GUARD_PERCENTILE / 100,
        "limit": limit,
        "exact_copies": copies,
        "memorising": memorising,
        "verdict": _verdict(closer, copies, limit, len(gen)),
    }


def _verdict(closer: float, copies: int | None, limit: float, n_gen: int) -> str:
    if copies:
        return f"memorising: {copies} of {n_gen} generated cells copy a training cell's counts"
    if closer > limit:
        return (
            f"memorising: {closer:.1%} of generated cells sit closer to a training cell than "
            f"95% of held-out cells do (about 5% expected, limit {limit:.0%})"
        )
    return (
        f"no sign of memorisation: {closer:.1%} of generated cells sit closer to a training cell "
        f"than 95% of held-out cells do (about 5% expected, limit {limit:.0%})"
    )
