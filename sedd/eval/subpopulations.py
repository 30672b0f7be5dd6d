"""Do generated cells fill every sub-population of their label, in the real proportions?

A label such as ``CD19+ B`` can hold distinct sub-populations (naive B cells and a few plasma
cells). Pooled distances and per-label means barely move when a generator makes only the largest
one, so the check clusters real and generated cells together and compares, label by label, how
the two sets spread over the label's clusters:

* ``joint_embedding``: one kNN graph over real and generated cells' PCA scores, Leiden clusters
  on it (igraph's implementation, as scanpy runs it) and a UMAP of it, all seeded;
* ``subpopulation_recovery``: for each label, every cluster holding >= ``MIN_SHARE`` of the
  label's real cells, with the share of the label's real and of its generated cells in it. The
  label is *recovered* when every such cluster's generated share is within ``TOLERANCE`` of its
  real share. The held-out real cells, scored the same way, show how often a set of that size
  passes by chance (a label's 8 held-out cells move a share by 12.5 points a cell);
* ``recovery_over_seeds``: the same check on each seed's generated set alone, each the held-out
  cells' size and label mix, so a seed's count of labels recovered compares with the held-out
  cells' (pooling seeds would let a label pass more easily: more cells, less noisy shares).

scanpy (with igraph and umap-learn) is imported when ``joint_embedding`` runs: it is the
``quality`` extra, not a base dependency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sedd.eval.report_sets import over_seeds

MIN_SHARE = 0.15  # a real sub-cluster is checked when it holds this share of its label's cells
TOLERANCE = 0.10  # generated share within +-10 points of the real share
NEIGHBOURS = 15  # the kNN graph's neighbours per cell (scanpy's default)


@dataclass(frozen=True)
class JointEmbedding:
    """Leiden clusters and UMAP coordinates of real and generated cells, clustered together."""

    real_clusters: np.ndarray  # (N_real,) cluster name of each real cell
    gen_clusters: np.ndarray  # (N_gen,)
    real_umap: np.ndarray  # (N_real, 2)
    gen_umap: np.ndarray  # (N_gen, 2)


def joint_embedding(
    real_pcs: np.ndarray,
    gen_pcs: np.ndarray,
    *,
    seed: int = 0,
    resolution: float = 1.0,
    n_neighbors: int = NEIGHBOURS,
) -> JointEmbedding:
    """Cluster and embed real (N_real, P) and generated (N_gen, P) PCA scores together.

    The kNN graph, Leiden (``flavor="igraph"``, 2 iterations, undirected) and UMAP all take
    ``seed``, so the same inputs give the same clusters and the same figure."""
    import anndata
    import scanpy as sc

    if real_pcs.shape[1] != gen_pcs.shape[1]:
        raise ValueError(
            f"real and generated PCA scores need the same components, got {real_pcs.shape} "
            f"and {gen_pcs.shape}."
        )
    points = np.vstack([real_pcs, gen_pcs]).astype(np.float32)  # (N_real + N_gen, P)
    adata = anndata.AnnData(X=points, obsm={"X_pca": points})
    k = min(n_neighbors, len(points) - 1)
    sc.pp.neighbors(adata, n_neighbors=k, use_rep="X_pca", random_state=seed)
    sc.tl.leiden(
        adata,
        resolution=resolution,
        random_state=seed,
        flavor="igraph",
        n_iterations=2,
        directed=False,
    )
    sc.tl.umap(adata, random_state=seed)
    clusters = adata.obs["leiden"].astype(str).to_numpy()
    umap = np.asarray(adata.obsm["X_umap"], dtype=np.float64)  # (N, 2)
    n = len(real_pcs)
    return JointEmbedding(clusters[:n], clusters[n:], umap[:n], umap[n:])


def subpopulation_recovery(
    real_labels: Sequence[str],
    real_clusters: Sequence[str],
    gen_labels: Sequence[str],
    gen_clusters: Sequence[str],
    *,
    held_out: tuple[Sequence[str], Sequence[str]] | None = None,
    min_share: float = MIN_SHARE,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Per label: its real sub-clusters (>= ``min_share`` of its real cells), the real and
    generated share in each, and whether every one is within ``tolerance`` (``recovered``).
    ``held_out``: (labels, clusters) of real cells to score like the generated ones, as a
    reference (``held_out_share``, ``held_out_recovered``).

    A label with no generated cells is listed with ``recovered: False``; labels only in the
    generated set are left out (there is nothing real to recover)."""
    real_labels, real_clusters = _pair(real_labels, real_clusters, "real")
    sets = {"generated": _pair(gen_labels, gen_clusters, "generated")}
    if held_out is not None:
        sets["held_out"] = _pair(*held_out, "held-out")
    labels: dict[str, Any] = {}
    for label, n_real in _largest_first(real_labels):
        mine = real_clusters[real_labels == label]
        members = {name: clusters[names == label] for name, (names, clusters) in sets.items()}
        entry: dict[str, Any] = {"n_real": n_real}
        entry |= {f"n_{name}": len(cells) for name, cells in members.items()}
        entry["clusters"] = []
        for cluster, n_cluster in _largest_first(mine):
            real_share = n_cluster / n_real
            if real_share < min_share:
                break  # largest first: the rest are smaller
            row: dict[str, Any] = {"cluster": cluster, "real_share": real_share}
            for name, cells in members.items():
                share = float(np.mean(cells == cluster)) if len(cells) else 0.0
                row[f"{name}_share"] = share
                row[f"{name}_within_tolerance"] = abs(share - real_share) <= tolerance
            entry["clusters"].append(row)
        for name, cells in members.items():  # "recovered" (generated), "held_out_recovered"
            close = all(row[f"{name}_within_tolerance"] for row in entry["clusters"])
            key = "recovered" if name == "generated" else f"{name}_recovered"
            entry[key] = bool(len(cells)) and close
        labels[label] = entry
    out = {
        "min_share": min_share,
        "tolerance": tolerance,
        "n_clusters": len(set(real_clusters) | set(sets["generated"][1])),
        "labels_recovered": sum(entry["recovered"] for entry in labels.values()),
        "labels_checked": len(labels),
    }
    if held_out is not None:
        out["held_out_labels_recovered"] = sum(e["held_out_recovered"] for e in labels.values())
    return out | {"labels": labels}


def recovery_over_seeds(
    real_labels: Sequence[str],
    real_clusters: Sequence[str],
    gen_labels: np.ndarray,
    gen_clusters: np.ndarray,
    sets: Mapping[int, np.ndarray],
    held_out: tuple[Sequence[str], Sequence[str]],
    *,
    min_share: float = MIN_SHARE,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """``subpopulation_recovery`` of each seed's set (``sets``: seed -> rows of the generated
    cells, each in the held-out size and mix) against the same real sub-clusters, merged: per
    label and cluster the real and held-out shares, each seed's generated share and its mean;
    per label the seeds that recover it; ``labels_recovered_per_seed`` / ``_mean`` / ``_sd``
    beside ``held_out_labels_recovered``."""
    if not sets:
        raise ValueError("sub-population recovery needs >= 1 generated set, got none.")
    gen_labels, gen_clusters = _pair(gen_labels, gen_clusters, "generated")
    per_seed = [
        subpopulation_recovery(
            real_labels,
            real_clusters,
            gen_labels[rows],
            gen_clusters[rows],
            held_out=held_out,
            min_share=min_share,
            tolerance=tolerance,
        )
        for rows in sets.values()
    ]
    labels = {}
    for label, first in per_seed[0]["labels"].items():
        entries = [report["labels"][label] for report in per_seed]
        clusters = []
        for k, row in enumerate(first["clusters"]):
            shares = [entry["clusters"][k]["generated_share"] for entry in entries]
            clusters.append(
                {key: row[key] for key in ("cluster", "real_share", "held_out_share")}
                | {"held_out_within_tolerance": row["held_out_within_tolerance"]}
                | over_seeds(shares, "generated_share")
                | {
                    "generated_within_tolerance_per_seed": [
                        entry["clusters"][k]["generated_within_tolerance"] for entry in entries
                    ]
                }
            )
        recovered = [entry["recovered"] for entry in entries]
        labels[label] = {
            "n_real": first["n_real"],
            "n_held_out": first["n_held_out"],
            "n_generated_per_seed": [entry["n_generated"] for entry in entries],
            "clusters": clusters,
            "recovered_per_seed": recovered,
            "seeds_recovered": sum(recovered),
            "held_out_recovered": first["held_out_recovered"],
        }
    return {
        "min_share": min_share,
        "tolerance": tolerance,
        "n_clusters": len(set(np.asarray(real_clusters, str)) | set(gen_clusters)),
        "labels_checked": len(labels),
        "cells": {
            "real": len(real_labels),
            "held_out": len(held_out[0]),
            "generated_per_seed": [len(rows) for rows in sets.values()],
        },
        **over_seeds([report["labels_recovered"] for report in per_seed], "labels_recovered"),
        "held_out_labels_recovered": per_seed[0]["held_out_labels_recovered"],
        "labels": labels,
    }


def _pair(labels: Sequence[str], clusters: Sequence[str], name: str) -> tuple[np.ndarray, ...]:
    labels, clusters = np.asarray(labels, str), np.asarray(clusters, str)
    if len(labels) != len(clusters):
        raise ValueError(
            f"one label and one cluster a cell: {len(labels)} {name} labels for "
            f"{len(clusters)} clusters."
        )
    return labels, clusters


def _largest_first(values: np.ndarray) -> list[tuple[str, int]]:
    """(value, count) pairs, most frequent first, ties by name (so the order is stable)."""
    names, counts = np.unique(values, return_counts=True)
    pairs = [(str(n), int(c)) for n, c in zip(names, counts, strict=True)]
    return sorted(pairs, key=lambda item: (-item[1], item[0]))
