"""The single measurements of the perturbation report (``sedd.eval.perturbation``).

All take log1p-CP10k values (``sedd.eval.gene_metrics.log_normalize`` of raw counts) or PCA
scores of them:

* ``w2_distance``: exact 2-Wasserstein distance between two equal-size point sets (POT's
  ``ot.emd2`` when installed, else scipy's exact assignment: for two sets of n points with
  weights 1/n the optimal plan is a permutation, so both give the same number);
* ``mmd2_rbf``: unbiased MMD^2 with one RBF kernel, bandwidth = the median pairwise distance;
* ``frechet_distance``: re-exported from ``sedd.eval.distances``;
* ``de_test``: Wilcoxon rank-sum per gene against control cells, Benjamini-Hochberg FDR;
* ``log2_fold_change``: log2 of the ratio of mean CP10k expression;
* ``lfc_recovery``: slope and Pearson r of candidate LFCs against real ones;
* ``normalised_rank``: where each perturbation's own real profile ranks among all real profiles
  by distance to its candidate mean (0 best, 1 worst).
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
from scipy import stats
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from sedd.eval.distances import frechet_distance, median_bandwidths, mmd2_unbiased

__all__ = [
    "LFC_PSEUDOCOUNT",
    "de_test",
    "frechet_distance",
    "lfc_recovery",
    "log2_fold_change",
    "mmd2_rbf",
    "normalised_rank",
    "w2_backend",
    "w2_distance",
]

# Added to both mean CP10k values before the ratio, so a gene absent on one side has a finite
# LFC; 0.1 CP10k is about a third of one count in a 3,000-count cell.
LFC_PSEUDOCOUNT = 0.1


def w2_backend() -> str:
    """``"pot"`` when POT (``ot``) is importable, else ``"scipy"``."""
    return "pot" if importlib.util.find_spec("ot") is not None else "scipy"


def w2_distance(x: np.ndarray, y: np.ndarray) -> float:
    """W2 = sqrt(min over couplings of E|X - Y|^2), uniform weights, exact (no entropy)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(f"w2 needs two (n, d) sets of equal shape, got {x.shape} and {y.shape}.")
    cost = cdist(x, y, "sqeuclidean")  # (n, n)
    if w2_backend() == "pot":
        import ot

        weights = np.full(len(x), 1.0 / len(x))
        return float(np.sqrt(max(float(ot.emd2(weights, weights, cost)), 0.0)))
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].mean()))


def mmd2_rbf(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased MMD^2, k(a, b) = exp(-|a - b|^2 / (2 h^2)), h = median pooled distance."""
    return mmd2_unbiased(x, y, median_bandwidths(x, y, scales=(1.0,)))


def de_test(group_log: np.ndarray, control_log: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p-values, BH q-values) per gene of a two-sided Wilcoxon rank-sum test (Mann-Whitney U,
    asymptotic with tie correction) of ``group_log`` against ``control_log`` (cells, genes).
    A gene constant over both sets gets p = 1."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")
        _, p = stats.mannwhitneyu(group_log, control_log, axis=0, method="asymptotic")
    p = np.where(np.isfinite(p), p, 1.0)
    return p, stats.false_discovery_control(p, method="bh")


def log2_fold_change(group_log: np.ndarray, control_log: np.ndarray) -> np.ndarray:
    """log2((mean CP10k of group + c) / (mean CP10k of control + c)) per gene, c =
    ``LFC_PSEUDOCOUNT``; CP10k = expm1 of the log1p values."""
    group = np.expm1(group_log).mean(axis=0)  # (G,)
    control = np.expm1(control_log).mean(axis=0)
    return np.log2((group + LFC_PSEUDOCOUNT) / (control + LFC_PSEUDOCOUNT))


def lfc_recovery(real_lfc: np.ndarray, candidate_lfc: np.ndarray) -> dict[str, float | None]:
    """Least-squares slope of candidate on real LFCs, and their Pearson r (None below 3 genes
    or when either side is constant). A generator that shrinks effects has slope < 1."""
    if len(real_lfc) < 3 or np.ptp(real_lfc) == 0 or np.ptp(candidate_lfc) == 0:
        return {"lfc_slope": None, "lfc_pearson": None}
    fit = stats.linregress(real_lfc, candidate_lfc)
    return {"lfc_slope": float(fit.slope), "lfc_pearson": float(fit.rvalue)}


def normalised_rank(candidate_means: np.ndarray, reference_means: np.ndarray) -> np.ndarray:
    """Per perturbation p: the share of other perturbations q whose reference mean is closer
    (Euclidean) to p's candidate mean than p's own reference mean is; (P,) in [0, 1], 0 best.

    A model that predicts one response for every perturbation ranks about 0.5 on average.
    """
    if candidate_means.shape != reference_means.shape or len(candidate_means) < 2:
        raise ValueError(
            "the rank needs >= 2 perturbations with a candidate and a reference mean each, got "
            f"{candidate_means.shape} and {reference_means.shape}."
        )
    distance = cdist(candidate_means, reference_means)  # (P, P): candidate p vs reference q
    own = np.diag(distance)[:, None]  # (P, 1)
    closer = (distance < own).sum(axis=1)  # the diagonal is never < itself
    return closer / (len(distance) - 1)
