"""The quality report's within-label gene-gene correlation agreement, at equal numbers of cells.

The figure (``HeldOut.within_label_agreement``) is the Pearson r between a set's within-label
gene-gene correlations and the training cells'. It grows with the number of cells in the set (a
correlation matrix from more cells is less noisy), so each seed's generated set, matched to the
held-out cells' size and label mix (``sedd.eval.report_sets``), is scored alone and set beside the
held-out cells' figure at their own size: ``generated_mean`` +- ``generated_sd`` over seeds
against ``held_out``. All seeds' cells pooled give ``generated_pooled``, a less noisy view that
is not comparable with ``held_out`` (its ``cells`` say how many it pools).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sedd.eval.gene_metrics import log_normalize, top_variable_genes
from sedd.eval.quality import HeldOut, within_label_correlation
from sedd.eval.report_sets import LabelledCounts, over_seeds

TOP_GENES = 100  # genes in a within-label correlation matrix (the project's figure uses 100)
TOP_LABELS = 5  # labels with their own within-label figure: the largest held-out ones
MIN_LABEL_CELLS = 5  # fewer cells of a label on a side: no within-label figure (None)


def within_label_agreements(
    genes: Sequence[str],
    train: LabelledCounts,
    test: LabelledCounts,
    generated: LabelledCounts,
    sets: Mapping[int, np.ndarray],
    top_labels: int = TOP_LABELS,
) -> dict[str, Any]:
    """Pearson r of within-label gene-gene correlations with the training cells': over all
    labels (the project's figure: 100 genes most variable in the training cells), and for the
    ``top_labels`` largest held-out labels, each against its own training cells over its own
    100 most variable genes. ``sets``: seed -> rows of ``generated`` in the held-out mix.

    Each figure: ``held_out`` (the held-out cells), ``generated_per_seed`` / ``_mean`` / ``_sd``
    (each seed's set, the held-out size) and ``generated_pooled`` (all generated cells)."""
    top = top_variable_genes(log_normalize(train.counts), TOP_GENES)
    held = HeldOut(
        genes=list(genes),
        test=test.counts,
        test_labels=list(test.labels),
        train=train.counts,
        reference=within_label_correlation(train.counts, train.labels, top),
        top_genes=top,
    )
    per_seed = [
        _agreement(held, generated.counts[rows], generated.labels[rows]) for rows in sets.values()
    ]
    all_labels = {
        "cells": {
            "held_out": len(test.labels),
            "generated_per_seed": [len(rows) for rows in sets.values()],
            "generated_pooled": len(generated.labels),
        },
        "held_out": _agreement(held, test.counts, test.labels),
        **over_seeds(per_seed),
        "generated_pooled": _agreement(held, generated.counts, generated.labels),
    }
    names, counts = np.unique(test.labels, return_counts=True)
    largest = [str(n) for _, n in sorted(zip(-counts, names, strict=True))][:top_labels]
    per_label = {label: _one_label(held, train, test, generated, sets, label) for label in largest}
    return {"all_labels": all_labels, "per_label": per_label}


def _one_label(
    held: HeldOut,
    train: LabelledCounts,
    test: LabelledCounts,
    generated: LabelledCounts,
    sets: Mapping[int, np.ndarray],
    label: str,
) -> dict[str, Any]:
    """One label's figure against its own training cells, over its own 100 genes."""
    label_train = train.counts[train.labels == label]
    mine = generated.labels == label
    seed_rows = [rows[mine[rows]] for rows in sets.values()]
    entry: dict[str, Any] = {
        "n_train": len(label_train),
        "n_held_out": int((test.labels == label).sum()),
        "n_generated_per_seed": [len(rows) for rows in seed_rows],
        "n_generated_pooled": int(mine.sum()),
    }
    if len(label_train) < MIN_LABEL_CELLS:
        nothing = over_seeds([None] * len(seed_rows))
        return entry | {"held_out": None, **nothing, "generated_pooled": None}
    label_top = top_variable_genes(log_normalize(label_train), TOP_GENES)
    reference = within_label_correlation(label_train, np.full(len(label_train), label), label_top)
    own = replace(held, reference=reference, top_genes=label_top)
    entry["held_out"] = _agreement(own, test.counts[test.labels == label])
    entry |= over_seeds([_agreement(own, generated.counts[rows]) for rows in seed_rows])
    entry["generated_pooled"] = _agreement(own, generated.counts[mine])
    return entry


def _agreement(
    held: HeldOut, counts: np.ndarray, labels: Sequence[str] | np.ndarray | None = None
) -> float | None:
    """The figure of ``counts`` (one label's cells when ``labels`` is None); None below
    ``MIN_LABEL_CELLS`` cells or when it is not finite (a constant gene)."""
    if len(counts) < MIN_LABEL_CELLS:
        return None
    labels = ["one label"] * len(counts) if labels is None else list(labels)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = held.within_label_agreement(counts, labels)
    return float(value) if np.isfinite(value) else None
