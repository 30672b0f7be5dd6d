"""A quality report of a generated set against labelled real cells (``sedd quality``).

The generated cells follow the held-out cells' label mix, over one or more seeds. The figures
use a PCA fitted on the real training cells, so that held-out and generated cells are both
projected out-of-sample; the distances (4) use one fitted on half of them.

1. sub-population recovery per label (``sedd.eval.subpopulations``), on a joint clustering of
   all real cells (training and held-out) with the generated ones;
2. within-label gene-gene correlation agreement (``HeldOut.within_label_agreement``), for the
   largest labels each against that label's training cells, and over all labels; held-out real
   cells give the reference value;
3. label kNN accuracy (``sedd.eval.nearest_training``) of generated and of held-out cells;
4. energy distance and MMD^2 (``sedd.eval.distances``) of each seed's set against the held-out
   cells, next to the noise floor: held-out cells against training samples of the same size and
   label mix (in a PCA of its own, fitted on the other training cells);
5. the memorisation guard (``sedd.eval.nearest_training``);
6. marker-gene score quantiles (``sedd.eval.markers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sedd.eval.distances import energy_distance, mmd2_unbiased
from sedd.eval.gene_metrics import log_normalize, top_variable_genes
from sedd.eval.markers import marker_summary
from sedd.eval.metrics import fit_real_pca
from sedd.eval.nearest_training import label_knn_accuracy, memorisation_guard
from sedd.eval.quality import HeldOut, within_label_correlation
from sedd.eval.subpopulations import JointEmbedding, joint_embedding, subpopulation_recovery

N_PCS = 50
TOP_GENES = 100  # genes in a within-label correlation matrix (the project's figure uses 100)
TOP_LABELS = 5  # labels with their own within-label figure: the largest held-out ones
MIN_LABEL_CELLS = 5  # fewer cells of a label on a side: no within-label figure (None)
FLOOR_DRAWS = 5  # training samples for the distances' noise floor


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
    that made each generated cell (the distances are per seed); ``seed``: the PCA's, the
    clustering's and the UMAP's random state."""
    gen_seeds = np.asarray(gen_seeds)
    if len(gen_seeds) != len(generated.labels):
        raise ValueError(
            f"one seed a generated cell: {len(gen_seeds)} for {len(generated.labels)}."
        )
    train_log, test_log, gen_log = (log_normalize(x.counts) for x in (train, test, generated))
    pca = fit_real_pca(train_log, n_pcs, seed)
    train_pcs, test_pcs, gen_pcs = (pca.transform(x) for x in (train_log, test_log, gen_log))

    real_pcs = np.vstack([train_pcs, test_pcs])
    real_labels = np.concatenate([train.labels, test.labels])
    embedding = joint_embedding(real_pcs, gen_pcs, seed=seed, resolution=resolution)
    held_out_clusters = embedding.real_clusters[len(train.labels) :]
    recovery = subpopulation_recovery(
        real_labels,
        embedding.real_clusters,
        generated.labels,
        embedding.gen_clusters,
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
        "pca": {"fitted_on": "training cells", "components": int(pca.n_components_)},
        "subpopulations": recovery,
        "within_label_agreement": within_label_agreements(genes, train, test, generated),
        "label_knn_accuracy": {
            "generated": label_knn_accuracy(train_pcs, train.labels, gen_pcs, generated.labels),
            "held_out": label_knn_accuracy(train_pcs, train.labels, test_pcs, test.labels),
        },
        "distances": distances_with_floor(
            train_log, train.labels, test_log, test.labels, gen_log, gen_seeds, seed=seed
        ),
        "memorisation": memorisation_guard(
            train_pcs, test_pcs, gen_pcs, train_counts=train.counts, gen_counts=generated.counts
        ),
        "markers": markers,
    }
    return report, ReportArrays(embedding, real_labels, generated.labels, scores)


def within_label_agreements(
    genes: Sequence[str],
    train: LabelledCounts,
    test: LabelledCounts,
    generated: LabelledCounts,
    top_labels: int = TOP_LABELS,
) -> dict[str, Any]:
    """Pearson r of within-label gene-gene correlations with the training cells': over all
    labels (the project's figure: 100 genes most variable in the training cells), and for the
    ``top_labels`` largest held-out labels, each against its own training cells over its own
    100 most variable genes. Held-out real cells give the reference value of each."""
    top = top_variable_genes(log_normalize(train.counts), TOP_GENES)
    held = HeldOut(
        genes=list(genes),
        test=test.counts,
        test_labels=list(test.labels),
        train=train.counts,
        reference=within_label_correlation(train.counts, train.labels, top),
        top_genes=top,
    )
    names, counts = np.unique(test.labels, return_counts=True)
    largest = [str(n) for _, n in sorted(zip(-counts, names, strict=True))][:top_labels]
    per_label = {}
    for label in largest:
        label_train = train.counts[train.labels == label]
        sets = {
            "held_out": test.counts[test.labels == label],
            "generated": generated.counts[generated.labels == label],
        }
        entry: dict[str, Any] = {"n_train": len(label_train)}
        entry |= {f"n_{name}": len(counts) for name, counts in sets.items()}
        if len(label_train) < MIN_LABEL_CELLS:
            per_label[label] = entry | {"held_out": None, "generated": None}
            continue
        label_top = top_variable_genes(log_normalize(label_train), TOP_GENES)
        reference = within_label_correlation(
            label_train, np.full(len(label_train), label), label_top
        )
        mine = replace(held, reference=reference, top_genes=label_top)
        for name, counts in sets.items():
            entry[name] = _agreement(mine, counts, label)
        per_label[label] = entry
    return {
        "all_labels": {
            "held_out": _finite(held.within_label_agreement(test.counts, test.labels)),
            "generated": _finite(held.within_label_agreement(generated.counts, generated.labels)),
        },
        "per_label": per_label,
    }


def _agreement(held: HeldOut, counts: np.ndarray, label: str) -> float | None:
    if len(counts) < MIN_LABEL_CELLS:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        return _finite(held.within_label_agreement(counts, [label] * len(counts)))


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def distances_with_floor(
    train_log: np.ndarray,
    train_labels: np.ndarray,
    test_log: np.ndarray,
    test_labels: np.ndarray,
    gen_log: np.ndarray,
    gen_seeds: np.ndarray,
    *,
    seed: int = 0,
    n_pcs: int = N_PCS,
    draws: int = FLOOR_DRAWS,
) -> dict[str, Any]:
    """Energy distance and MMD^2 of each seed's generated set against the held-out cells, and
    their noise floor: the held-out cells against ``draws`` samples of real training cells in
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
    floor_sets = [pool_pcs[_matched_sample(pool_labels, test_labels, rng)] for _ in range(draws)]
    gen_sets = [gen_pcs[gen_seeds == s] for s in np.unique(gen_seeds)]
    out: dict[str, Any] = {
        "pca": {"fitted_on": "half the training cells", "cells": int(fit.sum())},
        "floor": "held-out vs the other training cells, same size and label mix",
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


def _matched_sample(
    pool_labels: np.ndarray, wanted_labels: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Row indices of ``pool_labels``: as many of each label as ``wanted_labels`` has (all of a
    label when the pool has fewer), drawn without replacement, sorted."""
    rows = []
    for label, n in zip(*np.unique(wanted_labels, return_counts=True), strict=True):
        pool = np.flatnonzero(pool_labels == label)
        rows.append(rng.choice(pool, min(int(n), len(pool)), replace=False))
    return np.sort(np.concatenate(rows))
