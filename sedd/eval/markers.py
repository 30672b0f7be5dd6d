"""Marker-gene scores of a label's cells: does a generated label keep its bimodal programmes?

A marker set is a label and genes that mark a sub-population of it (plasma-cell genes inside
``CD19+ B``). A cell's score is the mean of those genes' log-normalised expression, so a label
holding a few plasma cells among naive B cells has a long upper tail or a second mode that a
generator averaging them away loses. ``marker_summary`` gives the quantiles of real and
generated scores; ``default_marker_sets`` is the plasma-cell set, when the data has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

QUANTILES = (10, 25, 50, 75, 90)
PLASMA_LABEL = "CD19+ B"
PLASMA_MARKERS = ("MZB1", "IGJ", "TNFRSF17", "FKBP11", "SSR4", "IGLL5")


def default_marker_sets(labels: Sequence[str], genes: Sequence[str]) -> dict[str, list[str]]:
    """The plasma-cell markers for ``CD19+ B`` when that label and every marker gene exist;
    otherwise no marker sets."""
    if PLASMA_LABEL in set(labels) and set(PLASMA_MARKERS) <= set(genes):
        return {PLASMA_LABEL: list(PLASMA_MARKERS)}
    return {}


def marker_scores(
    log_counts: np.ndarray, genes: Sequence[str], markers: Sequence[str]
) -> np.ndarray:
    """(N,) mean log-normalised expression of ``markers`` in each row of (N, G) ``log_counts``."""
    index = {g: i for i, g in enumerate(genes)}
    missing = [g for g in markers if g not in index]
    if missing or not markers:
        raise ValueError(f"marker genes {missing or list(markers)} are not among the genes.")
    return log_counts[:, [index[g] for g in markers]].mean(axis=1)


def quantiles(scores: np.ndarray) -> dict[str, float]:
    """``{"q10": ..., "q25": ..., ...}`` of ``scores`` (``QUANTILES``); empty for no cells."""
    if len(scores) == 0:
        return {}
    values = np.percentile(scores, QUANTILES)
    return {f"q{q}": float(v) for q, v in zip(QUANTILES, values, strict=True)}


def marker_summary(
    marker_sets: Mapping[str, Sequence[str]],
    genes: Sequence[str],
    real_log: np.ndarray,
    real_labels: Sequence[str],
    gen_log: np.ndarray,
    gen_labels: Sequence[str],
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per marker set: its genes, the cells and score quantiles of the label's real and
    generated cells; and the (real, generated) scores themselves, for the plots."""
    real_labels, gen_labels = np.asarray(real_labels, str), np.asarray(gen_labels, str)
    summary: dict[str, Any] = {}
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for label, markers in marker_sets.items():
        real = marker_scores(real_log[real_labels == label], genes, markers)
        gen = marker_scores(gen_log[gen_labels == label], genes, markers)
        summary[label] = {
            "genes": list(markers),
            "n_real": len(real),
            "n_generated": len(gen),
            "real": quantiles(real),
            "generated": quantiles(gen),
        }
        scores[label] = (real, gen)
    return summary, scores
