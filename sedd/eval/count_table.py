"""scDesign's count-level check: how far generated counts are from held-out real ones, statistic
by statistic, beside how far the training cells are from the same held-out cells.

Each statistic is a distribution over genes, cells or gene pairs; a row of the table is the KS
distance (``scipy.stats.ks_2samp`` statistic, 0 = same distribution, 1 = disjoint) between the
statistic's values on generated cells and on held-out cells, and the same distance for training
cells. All on raw counts (Kendall's tau is unchanged by any monotone rescaling):

* per gene: mean, variance, coefficient of variation (std / mean, genes with mean 0 left out)
  and zero fraction;
* per cell: zero fraction and library size;
* per gene pair, over the ``n_genes`` genes most variable in the held-out cells (log1p counts):
  Pearson and Kendall correlations (pairs where a side is constant are left out).

Training cells are subsampled to the generated cells' number so both rows compare equal numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import kendalltau, ks_2samp

COUNT_TABLE_SCALE = "counts"
STATISTICS = (
    "gene_mean",
    "gene_variance",
    "gene_cv",
    "gene_zero_fraction",
    "cell_zero_fraction",
    "cell_library_size",
    "gene_pair_pearson",
    "gene_pair_kendall",
)
PAIR_GENES = 50


@dataclass(frozen=True)
class CountTableRow:
    """One statistic: KS(generated, held-out) and KS(train, held-out); None without train."""

    generated_vs_held_out: float
    train_vs_held_out: float | None


def count_statistics(counts: np.ndarray, pair_genes: np.ndarray) -> dict[str, np.ndarray]:
    """Each statistic's values on ``counts`` (cells, genes); pairs over columns ``pair_genes``."""
    counts = np.asarray(counts, dtype=np.float64)
    mean, variance = counts.mean(axis=0), counts.var(axis=0, ddof=1)
    expressed = mean > 0
    pearson, kendall = pair_correlations(counts[:, pair_genes])
    return {
        "gene_mean": mean,
        "gene_variance": variance,
        "gene_cv": np.sqrt(variance[expressed]) / mean[expressed],
        "gene_zero_fraction": (counts == 0).mean(axis=0),
        "cell_zero_fraction": (counts == 0).mean(axis=1),
        "cell_library_size": counts.sum(axis=1),
        "gene_pair_pearson": pearson,
        "gene_pair_kendall": kendall,
    }


def pair_correlations(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Pearson, Kendall) of every gene pair of ``counts`` (cells, k): k(k-1)/2 values each,
    pairs with a constant gene left out."""
    varies = counts.std(axis=0) > 0
    counts = counts[:, varies]
    k = counts.shape[1]
    if k < 2:
        return np.empty(0), np.empty(0)
    upper = np.triu_indices(k, 1)
    pearson = np.corrcoef(counts, rowvar=False)[upper]
    rows, cols = upper
    kendall = np.array(
        [kendalltau(counts[:, i], counts[:, j])[0] for i, j in zip(rows, cols, strict=True)]
    )
    return pearson, kendall[np.isfinite(kendall)]


def top_variable(counts: np.ndarray, n: int) -> np.ndarray:
    """Columns of the ``n`` genes whose log1p counts vary most (ties by column)."""
    spread = np.log1p(np.asarray(counts, dtype=np.float64)).var(axis=0)
    return np.argsort(-spread, kind="stable")[:n]


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample KS statistic; 1.0 when a side has no values (nothing to compare)."""
    if len(a) == 0 or len(b) == 0:
        return 1.0
    return float(ks_2samp(a, b, method="asymp").statistic)  # only the statistic is used


def count_table(
    generated: np.ndarray,
    held_out: np.ndarray,
    train: np.ndarray | None = None,
    *,
    n_genes: int = PAIR_GENES,
    seed: int = 0,
) -> dict[str, CountTableRow]:
    """The table: per statistic, KS against the held-out cells (all three (cells, genes) counts
    over the same genes). ``train`` is subsampled to ``len(generated)`` cells."""
    if generated.shape[1] != held_out.shape[1]:
        raise ValueError(
            f"generated cells have {generated.shape[1]} genes and held-out cells "
            f"{held_out.shape[1]}; pass both over the same genes."
        )
    pairs = top_variable(held_out, n_genes)
    reference = count_statistics(held_out, pairs)
    sides = {"generated": count_statistics(generated, pairs)}
    if train is not None:
        if len(train) > len(generated):
            rows = np.random.default_rng(seed).choice(len(train), len(generated), replace=False)
            train = train[np.sort(rows)]
        sides["train"] = count_statistics(train, pairs)
    return {
        name: CountTableRow(
            ks_distance(sides["generated"][name], reference[name]),
            ks_distance(sides["train"][name], reference[name]) if "train" in sides else None,
        )
        for name in STATISTICS
    }


def count_table_json(table: dict[str, CountTableRow], n_genes: int = PAIR_GENES) -> dict:
    """The table as ``count_table.json`` writes it, saying its scale and distance."""
    return {
        "scale": COUNT_TABLE_SCALE,
        "distance": "two-sample KS statistic (scipy.stats.ks_2samp) vs held-out real cells",
        "gene_pairs": f"the {n_genes} genes most variable in the held-out cells (log1p counts)",
        "train_cells": "subsampled to the generated cells' number",
        "statistics": {
            name: {
                "generated_vs_held_out": row.generated_vs_held_out,
                "train_vs_held_out": row.train_vs_held_out,
            }
            for name, row in table.items()
        },
    }
