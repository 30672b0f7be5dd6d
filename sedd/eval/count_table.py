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

**Equal numbers of cells.** A KS distance between two samples sits above 0 by chance, the more
the fewer values they hold, and a per-gene statistic from fewer cells is noisier, so the two rows
compare the same number of cells against the same held-out cells: k = min(generated, training
cells), the larger side subsampled without replacement. The training row is the mean (and sd)
over ``TRAIN_DRAWS`` subsamples of the training cells, so one lucky draw does not set it.
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
TRAIN_DRAWS = 5  # subsamples of the training cells the training row is the mean of


@dataclass(frozen=True)
class CountTableRow:
    """One statistic: KS(generated, held-out) and KS(train, held-out), the latter the mean (and
    sd) over draws of the training cells (None without them); ``n_cells`` generated (and
    training) cells against ``n_held_out`` held-out cells."""

    generated_vs_held_out: float
    train_vs_held_out: float | None
    train_vs_held_out_sd: float | None = None
    n_cells: int = 0
    n_held_out: int = 0
    train_draws: int = 0


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
    draws: int = TRAIN_DRAWS,
) -> dict[str, CountTableRow]:
    """The table: per statistic, KS against the held-out cells (all three (cells, genes) counts
    over the same genes). Generated and ``train`` cells are compared at the same number, the
    smaller of the two (the larger subsampled with ``seed``); the training row is the mean over
    ``draws`` subsamples (one when the training cells are no more than that number)."""
    if generated.shape[1] != held_out.shape[1]:
        raise ValueError(
            f"generated cells have {generated.shape[1]} genes and held-out cells "
            f"{held_out.shape[1]}; pass both over the same genes."
        )
    if draws < 1:
        raise ValueError(f"`draws` must be >= 1, got {draws}.")
    rng = np.random.default_rng(seed)
    k = len(generated) if train is None else min(len(generated), len(train))
    pairs = top_variable(held_out, n_genes)
    reference = count_statistics(held_out, pairs)
    mine = count_statistics(_subsample(generated, k, rng), pairs)
    drawn = []
    if train is not None:
        for _ in range(1 if len(train) == k else draws):
            drawn.append(count_statistics(_subsample(train, k, rng), pairs))
    table = {}
    for name in STATISTICS:
        ks = [ks_distance(stats[name], reference[name]) for stats in drawn]
        table[name] = CountTableRow(
            generated_vs_held_out=ks_distance(mine[name], reference[name]),
            train_vs_held_out=float(np.mean(ks)) if ks else None,
            train_vs_held_out_sd=float(np.std(ks, ddof=1)) if len(ks) > 1 else None,
            n_cells=k,
            n_held_out=len(held_out),
            train_draws=len(drawn),
        )
    return table


def _subsample(counts: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` rows of ``counts`` drawn without replacement, in their order (all when k = N)."""
    if k >= len(counts):
        return counts
    return counts[np.sort(rng.choice(len(counts), k, replace=False))]


def count_table_json(table: dict[str, CountTableRow], n_genes: int = PAIR_GENES) -> dict:
    """The table as ``count_table.json`` writes it, saying its scale, distance and cells."""
    first = next(iter(table.values()))
    with_train = first.train_vs_held_out is not None
    return {
        "scale": COUNT_TABLE_SCALE,
        "distance": "two-sample KS statistic (scipy.stats.ks_2samp) vs held-out real cells",
        "gene_pairs": f"the {n_genes} genes most variable in the held-out cells (log1p counts)",
        "cells": {
            "held_out": first.n_held_out,
            "generated": first.n_cells,
            "train": first.n_cells if with_train else None,
        },
        "train_cells": f"generated and training cells compared at the same number, the smaller "
        f"side's; train_vs_held_out is the mean over {first.train_draws} subsample(s) of the "
        "training cells (train_vs_held_out_sd their sd)",
        "statistics": {
            name: {
                "generated_vs_held_out": row.generated_vs_held_out,
                "train_vs_held_out": row.train_vs_held_out,
                "train_vs_held_out_sd": row.train_vs_held_out_sd,
            }
            for name, row in table.items()
        },
    }
