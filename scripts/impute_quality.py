"""Imputation quality on the held-out PBMC cells (issues 34 and 47): hide a share of the genes,
impute them with ``Model.impute(..., n_samples=k, expected=True)``, and score the per-gene
correlation with the hidden truth against the label-mean baseline (each hidden gene predicted by
its label's training mean).

Per hidden gene: Pearson r over the held-out cells between log1p of the prediction (the first
draw, ``layers["mean_of_draws"]``, or ``layers["expected_counts"]``: per draw, each gene's mean
under the distribution it was drawn from, averaged over the k draws) and log1p of the true count,
averaged over the hidden genes with variance in both. The same genes are hidden in every cell
(``impute`` observes whole genes); each --mask-seeds seed hides another random share.

Two more references: the label mean scaled by each cell's depth in its shown genes (a stronger
baseline than the label mean: depth is most of the within-label signal), and the model's own
conditional mean of each hidden gene given the shown ones (one fp32 forward with the hidden genes
masked at the noise level of that masked share; sum over counts k of k * p(k)). The mean of k
draws estimates that conditional mean with sampling noise, so it approaches this figure as k
grows; the expected counts estimate it with less noise (a Rao-Blackwellised mean).

    OMP_NUM_THREADS=1 python scripts/impute_quality.py --n-samples 1 8 --mask-seeds 0 1 --steps 10
"""

from __future__ import annotations

import argparse
import json
import math
import warnings

import anndata
import numpy as np
import torch

import sedd
from sedd.checkpoints import load_checkpoint
from sedd.defaults import BUNDLED_DATA, DEFAULT_MODEL


def per_gene_r(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Mean over genes (columns) of Pearson r between log1p(predicted) and log1p(truth)."""
    a, b = np.log1p(predicted), np.log1p(truth)
    keep = (a.std(axis=0) > 0) & (b.std(axis=0) > 0)
    a, b = a[:, keep] - a[:, keep].mean(axis=0), b[:, keep] - b[:, keep].mean(axis=0)
    r = (a * b).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))
    return float(r.mean())


def depth_scaled_label_mean(
    train_x: np.ndarray,
    train_labels: np.ndarray,
    test_x: np.ndarray,
    test_labels: np.ndarray,
    shown: np.ndarray,
) -> np.ndarray:
    """Each label's mean of the training cells' counts per count in their shown genes, times the
    held-out cell's count in its shown genes."""
    train_depth = np.maximum(train_x[:, shown].sum(axis=1, keepdims=True), 1)
    rate = {
        lab: (train_x / train_depth)[train_labels == lab].mean(axis=0) for lab in set(train_labels)
    }
    return np.stack([rate[lab] for lab in test_labels]) * test_x[:, shown].sum(
        axis=1, keepdims=True
    )


@torch.no_grad()
def conditional_mean(
    model_path: str, test_x: np.ndarray, test_labels: np.ndarray, hidden: np.ndarray
) -> np.ndarray:
    """The model's mean count of every gene given the shown ones: one fp32 forward with the hidden
    genes masked, at the noise level whose masking probability is the hidden share."""
    loaded = load_checkpoint(model_path)
    tokens = loaded.config.tokens
    x = torch.as_tensor(np.minimum(test_x, tokens.num_bins - 1), dtype=torch.long)
    x[:, torch.as_tensor(hidden)] = tokens.mask_index
    share = len(hidden) / test_x.shape[1]
    sigma = torch.full((len(x),), -math.log1p(-share))  # 1 - e^-sigma = share
    labels = loaded.perturbation_labels([str(lab) for lab in test_labels])
    logits = loaded.model(x, sigma, labels).float()[..., : tokens.num_bins]
    probs = torch.softmax(logits, dim=-1)
    return (probs * torch.arange(tokens.num_bins, dtype=probs.dtype)).sum(-1).numpy()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--data", default=str(BUNDLED_DATA))
    p.add_argument("--label-key", default="bulk_labels")
    p.add_argument("--hide", type=float, default=0.3, help="share of the genes hidden")
    p.add_argument("--n-samples", type=int, nargs="+", default=[1, 8])
    p.add_argument("--mask-seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=None, help="default: the library's")
    p.add_argument("--precision", default="auto")
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    model = sedd.load(args.model, precision=args.precision, device="cpu")
    genes = list(model.genes)
    cells = anndata.read_h5ad(args.data)[:, genes].copy()
    split = cells.obs["split"].astype(str).to_numpy()
    train, test = cells[split == "train"], cells[split == "test"].copy()
    train_x, test_x = np.asarray(train.X.todense()), np.asarray(test.X.todense())
    train_labels = train.obs[args.label_key].astype(str).to_numpy()
    test_labels = test.obs[args.label_key].astype(str).to_numpy()
    label_mean = {lab: train_x[train_labels == lab].mean(axis=0) for lab in set(train_labels)}
    baseline = np.stack([label_mean[lab] for lab in test_labels])

    results = []
    for mask_seed in args.mask_seeds:
        rng = np.random.default_rng(mask_seed)
        hidden = np.sort(rng.choice(len(genes), round(args.hide * len(genes)), replace=False))
        shown = np.setdiff1d(np.arange(len(genes)), hidden)
        row = {"mask_seed": mask_seed, "hidden_genes": len(hidden),
               "label_mean": per_gene_r(baseline[:, hidden], test_x[:, hidden])}  # fmt: skip
        row["label_mean_x_depth"] = per_gene_r(
            depth_scaled_label_mean(train_x, train_labels, test_x, test_labels, shown)[:, hidden],
            test_x[:, hidden],
        )
        expected = conditional_mean(args.model, test_x, test_labels, hidden)
        row["model_conditional_mean"] = per_gene_r(expected[:, hidden], test_x[:, hidden])
        for k in args.n_samples:
            made = model.impute(test[:, shown].copy(), condition_key=args.label_key, seed=0,
                                steps=args.steps, n_samples=k, expected=True,
                                progress=False)  # fmt: skip
            made = made[:, [genes[i] for i in hidden]]
            first = np.asarray(made.X.todense())
            row[f"one_draw@{k}"] = per_gene_r(first, test_x[:, hidden])
            rao_blackwell = np.asarray(made.layers["expected_counts"].todense())
            row[f"expected_counts_of_{k}_draws"] = per_gene_r(rao_blackwell, test_x[:, hidden])
            if k > 1:
                mean = np.asarray(made.layers["mean_of_draws"].todense())
                row[f"mean_of_{k}_draws"] = per_gene_r(mean, test_x[:, hidden])
        print(json.dumps(row))
        results.append(row)
    keys = [k for k in results[0] if k not in ("mask_seed", "hidden_genes")]
    print("mean over mask seeds:", {k: round(float(np.mean([r[k] for r in results])), 3)
                                    for k in keys})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
