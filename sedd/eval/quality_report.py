"""A quality report of a generated set against labelled real cells (``sedd quality``).

The generated cells follow the held-out cells' label mix, over one or more seeds. The figures
use a PCA fitted on the real training cells, so that held-out and generated cells are both
projected out-of-sample; the distances (4) use one fitted on half of them.

Every figure compares equal numbers of cells, or says why its size does not matter (``sizes``
in the report): each seed's set, matched to the held-out cells' size and label mix
(``sedd.eval.report_sets``), is scored alone, beside the held-out cells at their own size, and
summarised as mean and sd over seeds. Figures over all seeds' cells pooled say so in their name
(``generated_pooled``) and their ``cells``.

1. sub-population recovery per label (``sedd.eval.subpopulations``), on a joint clustering of
   all real cells (training and held-out) with the generated ones, per seed;
2. within-label gene-gene correlation agreement (``sedd.eval.within_label``), for the largest
   labels each against that label's training cells, and over all labels, per seed; held-out
   real cells give the reference value;
3. label kNN accuracy (``sedd.eval.nearest_training``) of generated and of held-out cells;
4. energy distance and MMD^2 (``sedd.eval.distances``) of each seed's set against the held-out
   cells, next to the noise floor: held-out cells against training samples of the same size and
   label mix (in a PCA of its own, fitted on the other training cells);
5. the memorisation guard (``sedd.eval.nearest_training``);
6. marker-gene score quantiles (``sedd.eval.markers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sedd.eval.distances import energy_distance, mmd2_unbiased
from sedd.eval.gene_metrics import log_normalize
from sedd.eval.markers import marker_summary
from sedd.eval.metrics import fit_real_pca
from sedd.eval.nearest_training import (
    label_knn_accuracy,
    memorisation_guard,
    nearest_training_distances,
)
from sedd.eval.report_sets import LabelledCounts, matched_sample, over_seeds, seed_sets
from sedd.eval.subpopulations import JointEmbedding, joint_embedding, recovery_over_seeds
from sedd.eval.within_label import within_label_agreements

__all__ = ["SIZES", "LabelledCounts", "ReportArrays", "distances_with_floor", "quality_report"]

N_PCS = 50
FLOOR_DRAWS = 5  # training samples for the distances' noise floor
# How each figure of the report handles the number of cells it compares (``sizes``).
SIZES = {
    "subpopulations": "per seed: each seed's set (the held-out size and label mix) is checked "
    "alone against the real sub-clusters, as the held-out cells are; labels_recovered_mean is "
    "over seeds (pooled seeds' shares are less noisy, so a label would pass more easily)",
    "within_label_agreement": "per seed: the figure grows with the number of cells, so each "
    "seed's set (the held-out size and label mix) is scored alone and compared with held_out "
    "at its own size; generated_pooled pools every seed's cells and is not comparable with it",
    "label_knn_accuracy": "size-independent: a per-cell share (each cell is classified alone by "
    "a classifier fitted on the training cells), so its expectation does not depend on how "
    "many cells are scored; the per-seed values give its spread at the held-out size",
    "distances": "per seed: each seed's set (the held-out size and label mix) against the "
    "held-out cells; the floor's training samples have the held-out size and label mix (all of "
    "a label where the other half of the training cells has fewer)",
    "memorisation": "size-independent: shares and quantiles of per-cell nearest-training "
    "distances, whose expectations do not depend on the number of cells (per-seed shares "
    "given too); exact_copies counts over every generated cell, so pooling only makes the "
    "guard stricter",
    "markers": "size-independent: quantiles of a per-cell score, whose expectations do not "
    "depend on the number of cells; n_real and n_generated say how many each side has",
}


@dataclass(frozen=True)
class ReportArrays:
    """What the report's plots draw."""

    embedding: JointEmbedding
    real_labels: np.ndarray  # (N_real,) training then held-out cells, as the embedding
    gen_labels: np.ndarray  # (N_gen,)
    marker_scores: dict[str, tuple[np.ndarray, np.ndarray]]  # label -> (real, generated)


def quality_report(
    genes: Sequence[str],
    train: LabelledCounts,
    test: LabelledCounts,
    generated: LabelledCounts,
    gen_seeds: Sequence[int],
    *,
    marker_sets: Mapping[str, Sequence[str]] | None = None,
    seed: int = 0,
    resolution: float = 1.0,
    n_pcs: int = N_PCS,
) -> tuple[dict[str, Any], ReportArrays]:
    """The report (JSON-ready) and the arrays of its plots. ``gen_seeds`` (N_gen,): the seed
    that made each generated cell (the figures are per seed); ``seed``: the PCA's, the
    clustering's and the UMAP's random state, and the subsample's of a seed's set larger than
    the held-out mix."""
    gen_seeds = np.asarray(gen_seeds)
    if len(gen_seeds) != len(generated.labels):
        raise ValueError(
            f"one seed a generated cell: {len(gen_seeds)} for {len(generated.labels)}."
        )
    sets = seed_sets(generated.labels, gen_seeds, test.labels, seed)
    train_log, test_log, gen_log = (log_normalize(x.counts) for x in (train, test, generated))
    pca = fit_real_pca(train_log, n_pcs, seed)
    train_pcs, test_pcs, gen_pcs = (pca.transform(x) for x in (train_log, test_log, gen_log))

    real_pcs = np.vstack([train_pcs, test_pcs])
    real_labels = np.concatenate([train.labels, test.labels])
    embedding = joint_embedding(real_pcs, gen_pcs, seed=seed, resolution=resolution)
    held_out_clusters = embedding.real_clusters[len(train.labels) :]
    recovery = recovery_over_seeds(
        real_labels,
        embedding.real_clusters,
        generated.labels,
        embedding.gen_clusters,
        sets,
        held_out=(test.labels, held_out_clusters),
    )
    markers, scores = marker_summary(
        marker_sets or {},
        genes,
        np.vstack([train_log, test_log]),
        real_labels,
        gen_log,
        generated.labels,
    )
    report = {
        "sizes": SIZES,
        "pca": {"fitted_on": "training cells", "components": int(pca.n_components_)},
        "subpopulations": recovery,
        "within_label_agreement": within_label_agreements(genes, train, test, generated, sets),
        "label_knn_accuracy": _knn_accuracies(
            (train_pcs, train.labels), (test_pcs, test.labels), (gen_pcs, generated.labels), sets
        ),
        "distances": distances_with_floor(
            train_log, train.labels, test_log, test.labels, gen_log, sets, seed=seed
        ),
        "memorisation": _memorisation(train, train_pcs, test_pcs, generated, gen_pcs, sets),
        "markers": markers,
    }
    return report, ReportArrays(embedding, real_labels, generated.labels, scores)


PcsAndLabels = tuple[np.ndarray, np.ndarray]  # (N, P) PCA scores and (N,) labels


def _knn_accuracies(
    train: PcsAndLabels,
    test: PcsAndLabels,
    generated: PcsAndLabels,
    sets: Mapping[int, np.ndarray],
) -> dict[str, Any]:
    """Label kNN accuracy of the held-out cells, of each seed's set and of all seeds pooled."""
    gen_pcs, gen_labels = generated
    per_seed = [
        label_knn_accuracy(*train, gen_pcs[rows], gen_labels[rows])["accuracy"]
        if len(rows)
        else None
        for rows in sets.values()
    ]
    return {
        "cells": {
            "held_out": len(test[1]),
            "generated_per_seed": [len(rows) for rows in sets.values()],
            "generated_pooled": len(gen_labels),
        },
        "held_out": label_knn_accuracy(*train, *test),
        **over_seeds(per_seed, "generated_accuracy"),
        "generated_pooled": label_knn_accuracy(*train, *generated),
    }


def _memorisation(
    train: LabelledCounts,
    train_pcs: np.ndarray,
    test_pcs: np.ndarray,
    generated: LabelledCounts,
    gen_pcs: np.ndarray,
    sets: Mapping[int, np.ndarray],
) -> dict[str, Any]:
    """The guard over every generated cell, and each seed's share closer than the held-out
    cells' 5th percentile."""
    guard = memorisation_guard(
        train_pcs, test_pcs, gen_pcs, train_counts=train.counts, gen_counts=generated.counts
    )
    nearest = nearest_training_distances(train_pcs, gen_pcs)  # (N_gen,)
    per_seed = [
        float(np.mean(nearest[rows] < guard["held_out_p5"])) if len(rows) else None
        for rows in sets.values()
    ]
    cells = {
        "train": len(train.labels),
        "held_out": len(test_pcs),
        "generated": len(gen_pcs),
        "generated_per_seed": [len(rows) for rows in sets.values()],
    }
    return {"cells": cells, **guard, **over_seeds(per_seed, "closer_than_held_out_p5")}


def distances_with_floor(
    train_log: np.ndarray,
    train_labels: np.ndarray,
    test_log: np.ndarray,
    test_labels: np.ndarray,
    gen_log: np.ndarray,
    sets: Mapping[int, np.ndarray],
    *,
    seed: int = 0,
    n_pcs: int = N_PCS,
    draws: int = FLOOR_DRAWS,
) -> dict[str, Any]:
    """Energy distance and MMD^2 of each seed's generated set (``sets``: seed -> rows of
    ``gen_log``, each in the held-out size and label mix) against the held-out cells, and their
    noise floor: the held-out cells against ``draws`` samples of real training cells in
    the held-out label mix (as many of each label, or all a label has). Mean and sd of each.

    Every compared set must be out-of-sample for the PCA: training cells a PCA was fitted on
    spread wider in it than any other cells (on the bundled data the floor's energy distance is
    0.82 with a PCA fitted on all training cells, 0.28 out-of-sample). So this PCA is fitted on
    half the training cells (a random half of each label) and the floor's samples come from the
    other half."""
    rng = np.random.default_rng(seed)
    fit = _label_half(train_labels, rng)  # (M,) bool: the PCA's half
    pca = fit_real_pca(train_log[fit], n_pcs, seed)
    test_pcs, gen_pcs = pca.transform(test_log), pca.transform(gen_log)
    pool_pcs, pool_labels = pca.transform(train_log[~fit]), train_labels[~fit]
    floor_sets = [pool_pcs[matched_sample(pool_labels, test_labels, rng)] for _ in range(draws)]
    gen_sets = [gen_pcs[rows] for rows in sets.values()]
    out: dict[str, Any] = {
        "pca": {"fitted_on": "half the training cells", "cells": int(fit.sum())},
        "floor": "held-out vs the other training cells, same size and label mix",
        "cells": {
            "held_out": len(test_pcs),
            "generated_per_seed": [len(pts) for pts in gen_sets],
            "floor_per_draw": [len(pts) for pts in floor_sets],
        },
    }
    for name, distance in (("energy_distance", energy_distance), ("mmd2_rbf", mmd2_unbiased)):
        generated = [distance(test_pcs, pts) for pts in gen_sets]
        floor = [distance(test_pcs, pts) for pts in floor_sets]
        out[name] = {
            "generated_mean": float(np.mean(generated)),
            "generated_sd": float(np.std(generated, ddof=1)) if len(generated) > 1 else None,
            "generated_per_seed": [float(v) for v in generated],
            "floor_mean": float(np.mean(floor)),
            "floor_sd": float(np.std(floor, ddof=1)) if len(floor) > 1 else None,
            "floor_draws": [float(v) for v in floor],
        }
    return out


def _label_half(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N,) bool: a random half (rounded up) of each label's rows."""
    half = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == label))
        half[rows[: (len(rows) + 1) // 2]] = True
    return half
