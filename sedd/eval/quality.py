"""The project's quality figures of a generated set against held-out cells.

``HeldOut.from_file`` reads a labelled count file split into train and test cells (the bundled
PBMC counts by default); ``HeldOut.figures(counts, labels)`` scores a generated set:

* ``corr_rms``: RMS error of the gene-gene correlation matrix (100 most variable genes);
* ``mmd2_rbf`` and ``energy_distance``: distances in a PCA fitted on the training cells;
* ``within_label_agreement``: Pearson r between the set's within-label gene-gene correlations
  (each label's mean removed) and the training cells'. 0 means no structure inside a label,
  which is what drawing every gene independently given the label (one step) gives. It grows
  with the number of cells scored (a correlation matrix from more cells is less noisy), so
  compare it only between sets of one size: ``sedd calibrate``, ``sedd bench --compare`` and
  the steps study score sets of the held-out cells' size and label mix, and the held-out
  cells' own figure (``held_out_agreement``) is the real one at that size.

The study of quality against forwards (``scripts/quality_vs_steps.py``) and ``sedd bench
--compare`` both use it, so their figures are the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sedd.eval.gene_metrics import gene_correlation_matrix, log_normalize, top_variable_genes
from sedd.eval.metrics import evaluate_counts
from sedd.io.read import read_counts

FIGURES = ("corr_rms", "mmd2_rbf", "energy_distance", "within_label_agreement")


def within_label_correlation(counts: np.ndarray, labels: np.ndarray, genes: np.ndarray):
    """Upper triangle of the gene-gene correlation of ``genes`` after removing each label's mean,
    (K(K-1)/2,): the structure inside a label."""
    x = log_normalize(counts)[:, genes]  # (N, K)
    for label in np.unique(labels):
        rows = labels == label
        x[rows] -= x[rows].mean(axis=0)
    return gene_correlation_matrix(x)[np.triu_indices(len(genes), 1)]


def _dense(x) -> np.ndarray:
    return np.asarray(x.toarray() if hasattr(x, "toarray") else x)


@dataclass(frozen=True)
class HeldOut:
    """Held-out (test) and training cells of one labelled count file, in the model's genes."""

    genes: list[str]
    test: np.ndarray  # (N, G) counts
    test_labels: list[str]
    train: np.ndarray  # (M, G) counts, for the PCA and the within-label reference
    reference: np.ndarray  # the training cells' within-label correlations
    top_genes: np.ndarray  # the 100 genes most variable in the training cells

    @classmethod
    def from_file(
        cls, path: str | Path, genes: Sequence[str], label_key: str = "bulk_labels"
    ) -> HeldOut:
        adata = read_counts(path)
        missing = [g for g in genes if g not in adata.var_names]
        if missing:
            raise ValueError(
                f"the held-out file {path} lacks {len(missing)} of the model's genes "
                f"(e.g. {missing[:3]}); pass the file the model was trained on."
            )
        adata = adata[:, list(genes)]
        split = adata.obs["split"].astype(str)
        test, train = adata[split == "test"], adata[split == "train"]
        train_x = _dense(train.X)
        train_labels = np.asarray([str(v) for v in train.obs[label_key]])
        top = top_variable_genes(log_normalize(train_x), 100)
        return cls(
            genes=list(genes),
            test=_dense(test.X),
            test_labels=[str(v) for v in test.obs[label_key]],
            train=train_x,
            reference=within_label_correlation(train_x, train_labels, top),
            top_genes=top,
        )

    def figures(self, counts: np.ndarray, labels: Sequence[str]) -> dict[str, float]:
        """The quality figures of generated ``counts`` (N, G) whose cells have ``labels``."""
        overall = evaluate_counts(
            self.test,
            counts,
            self.genes,
            real_conditions=self.test_labels,
            gen_conditions=list(labels),
            pca_fit_counts=self.train,
        )["overall"]
        return {
            "corr_rms": float(overall["corr_rms"]),
            "mmd2_rbf": float(overall["mmd2_rbf"]),
            "energy_distance": float(overall["energy_distance"]),
            "within_label_agreement": self.within_label_agreement(counts, labels),
        }

    def within_label_agreement(self, counts: np.ndarray, labels: Sequence[str]) -> float:
        """Pearson r of the set's within-label correlations with the training cells'."""
        mine = within_label_correlation(counts, np.asarray(labels), self.top_genes)
        return float(np.corrcoef(mine, self.reference)[0, 1])

    def held_out_agreement(self) -> float:
        """The held-out cells' own within-label agreement: the real figure at their size, for
        sets of the same size and label mix."""
        return self.within_label_agreement(self.test, self.test_labels)
