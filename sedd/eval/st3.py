"""Held-out evaluation for ``scripts/inference_perturbseq.py``: real test cells vs predicted ones.

The reference h5ad holds raw counts (``.X``); its genes are aligned to the model's, its cells
restricted to the held-out split (``obs[split_key] == split_value``, when that column exists).
The metrics are ``sedd.eval.metrics.evaluate_counts``, per perturbation and overall; the PCA is
fitted on the reference cells outside the split when there are enough (out-of-sample for both
sides). ``st3_paired_scores`` adds st3's own scores (its ``metrics.json``): each predicted cell
against one held-out cell of its perturbation, entry by entry.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anndata
import numpy as np
import scipy.sparse as sp

from sedd.checkpoints import LoadedModel
from sedd.eval.gene_metrics import METRIC_SCALES
from sedd.eval.metrics import MIN_GROUP_CELLS, evaluate_counts
from sedd.io.read import GeneAlignmentWarning, align_genes, read_counts, read_h5ad_safely

REFERENCE_CONDITION_KEYS = ("perturbation", "target_gene", "gene", "condition", "bulk_labels")
WITHIN_BINS = (1, 3, 5, 10)  # st3's within_k


@dataclass
class HeldOutReference:
    path: Path
    key: str  # obs column of the labels
    genes: list[str]
    counts: sp.csr_matrix | np.ndarray  # (cells, genes) held-out cells, model gene order
    cell_labels: np.ndarray  # (cells,) str
    rest_counts: sp.csr_matrix | np.ndarray | None  # cells outside the split (PCA fit)
    split: dict[str, str] | None

    @property
    def n_cells(self) -> int:
        return int(self.counts.shape[0])

    @property
    def labels(self) -> list[str]:
        """Distinct labels, most cells first."""
        names, counts = np.unique(self.cell_labels, return_counts=True)
        return [str(names[i]) for i in np.argsort(-counts, kind="stable")]

    def describe(self) -> dict[str, Any]:
        return {
            "reference": {
                "path": str(self.path),
                "condition_key": self.key,
                "split": self.split,
                "cells": self.n_cells,
                "pca_fit_cells": None if self.rest_counts is None else self.rest_counts.shape[0],
            }
        }


def held_out_reference(
    path: str | Path,
    loaded: LoadedModel,
    key: str | None,
    split_key: str,
    split_value: str,
) -> HeldOutReference:
    """Read ``path``'s counts in the model's gene order, keep the held-out split."""
    path = Path(path)
    adata = read_counts(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GeneAlignmentWarning)  # extra genes are fine here
        adata = align_genes(adata, loaded.config.genes)
    if key is None:
        key = next((k for k in REFERENCE_CONDITION_KEYS if k in adata.obs.columns), None)
        if key is None:
            raise ValueError(
                f"--reference_data {path} has none of the obs columns "
                f"{list(REFERENCE_CONDITION_KEYS)}; pass --condition_key (obs columns: "
                f"{list(adata.obs.columns)})."
            )
    elif key not in adata.obs.columns:
        raise ValueError(
            f"--condition_key {key!r} is not an obs column of {path}; "
            f"available: {list(adata.obs.columns)}."
        )
    split = None
    rest: anndata.AnnData | None = None
    if split_key in adata.obs.columns:
        keep = (adata.obs[split_key].astype(str) == str(split_value)).to_numpy()
        if not keep.any():
            values = sorted(adata.obs[split_key].astype(str).unique())[:10]
            raise ValueError(
                f"no cell of {path} has {split_key} == {split_value!r}; values: {values}."
            )
        adata, rest = adata[keep], adata[~keep]
        split = {"key": split_key, "value": str(split_value)}
    rest_counts = rest.X if rest is not None and rest.n_obs >= MIN_GROUP_CELLS else None
    return HeldOutReference(
        path=path,
        key=key,
        genes=list(loaded.config.genes),
        counts=adata.X,
        cell_labels=adata.obs[key].astype(str).to_numpy(),
        rest_counts=rest_counts,
        split=split,
    )


def perturbseq_metrics(
    reference: HeldOutReference, generated: Path, *, n_pcs: int = 50, seed: int = 0
) -> dict[str, Any]:
    """``sedd.eval.metrics`` of the generated file against the held-out cells, per perturbation."""
    gen = read_h5ad_safely(generated, what="generated cells")
    if [str(g) for g in gen.var_names] != reference.genes:
        raise ValueError(f"{generated} does not have the model's genes in the model's order.")
    result = evaluate_counts(
        reference.counts,
        gen.X,
        reference.genes,
        real_conditions=reference.cell_labels,
        gen_conditions=generated_conditions(gen, generated),
        n_pcs=n_pcs,
        seed=seed,
        pca_fit_counts=reference.rest_counts,
    )
    return {
        "inputs": {"generated": str(generated), "generated_cells": gen.n_obs},
        "scale": METRIC_SCALES,
        **reference.describe(),
        **result,
    }


def generated_conditions(gen: anndata.AnnData, path: Path) -> np.ndarray:
    """Each generated cell's label: ``obs["condition"]`` (or ``perturbation`` in files written
    before the label was also stored as ``condition``)."""
    for key in ("condition", "perturbation"):
        if key in gen.obs.columns:
            return gen.obs[key].astype(str).to_numpy()
    raise ValueError(
        f"{path} has no obs['condition'] column (obs columns: {list(gen.obs.columns)}); pass a "
        "file written by sedd generate/predict."
    )


def st3_paired_scores(reference: HeldOutReference, generated: Path) -> dict[str, Any]:
    """st3's ``inference_perturbseq.py`` scores, in bins (a token is the count).

    st3 samples one cell under each held-out cell's label and compares the two entry by entry.
    Here the k-th generated cell of a perturbation is paired with its k-th held-out cell (file
    order); a perturbation's extra cells on either side are not scored. Both are an independent
    draw under the label against a real cell of that label, so the expected scores are st3's.
    The means are exact (integer sums), where st3 averages in float32.
    """
    gen = read_h5ad_safely(generated, what="generated cells")
    gen_labels = generated_conditions(gen, generated)
    cells = entries = equal_cells = equal_entries = abs_error = 0
    within = dict.fromkeys(WITHIN_BINS, 0)
    for label in dict.fromkeys(gen_labels):  # generated order
        real_rows = np.flatnonzero(reference.cell_labels == label)
        gen_rows = np.flatnonzero(gen_labels == label)
        n = min(len(real_rows), len(gen_rows))
        if n == 0:
            continue
        real = _dense_int(reference.counts[real_rows[:n]])  # (n, genes)
        predicted = _dense_int(gen.X[gen_rows[:n]])  # (n, genes)
        same, error = real == predicted, np.abs(real - predicted)
        cells, entries = cells + n, entries + same.size
        equal_cells += int(same.all(axis=1).sum())
        equal_entries += int(same.sum())
        abs_error += int(error.sum())
        for k in WITHIN_BINS:
            within[k] += int((error <= k).sum())
    if cells == 0:
        raise ValueError(
            f"no generated perturbation of {generated} has a held-out cell in "
            f"{reference.path} (obs[{reference.key!r}]); nothing to pair."
        )
    return {
        "exact_cell_match": equal_cells / cells,
        "per_gene_accuracy": equal_entries / entries,
        "mae_bins": abs_error / entries,
        "within_k": {str(k): within[k] / entries for k in WITHIN_BINS},
        "num_cells": cells,
    }


def _dense_int(x: Any) -> np.ndarray:
    return np.asarray(x.toarray() if sp.issparse(x) else x).astype(np.int64)
