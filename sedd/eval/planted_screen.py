"""A SEMI-SYNTHETIC Perturb-seq-like screen with planted truth, built from real counts.

No Perturb-seq data ships offline, so the perturbation report is tested on a screen whose answer
is known: real cells (e.g. the bundled PBMC counts) are the "control" cells; each synthetic
perturbation takes other real cells and scales a known set of genes by known factors:

* down (factor f < 1): binomial thinning, c' ~ Binomial(c, f), so E[c'] = f c exactly;
* up (factor f > 1): Poisson addition, c' = c + Poisson((f - 1) lambda), lambda = the cell's
  library size x the gene's share of all counts in the pool, so the gene's mean over cells
  becomes f times its pool mean (a cell with c = 0 can gain counts, as a real induction would).

Every gene not planted keeps its real counts, so the noise, sparsity and gene-gene structure
are real; only the planted effects are synthetic. The plan (which genes, which factors) and the
draw (which real cells, which thinning) have separate seeds: drawing twice from one plan gives
two independent screens of the same biology, the ideal "generated" set for a report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CONTROL_LABEL",
    "SEMI_SYNTHETIC_NOTE",
    "PlantedEffect",
    "ScreenDraw",
    "apply_effect",
    "draw_screen",
    "plan_effects",
    "planted_truth_uns",
    "split_pool",
]

CONTROL_LABEL = "non-targeting"
SEMI_SYNTHETIC_NOTE = (
    "SEMI-SYNTHETIC screen: real single-cell counts with planted perturbation effects (binomial "
    "thinning down, Poisson addition up); not a real Perturb-seq experiment."
)
# Planted factors are drawn log-uniformly from these ranges (down, up).
DOWN_FACTORS = (0.15, 0.5)
UP_FACTORS = (2.0, 4.0)


@dataclass(frozen=True)
class PlantedEffect:
    """The genes a synthetic perturbation changes and the factor each gene's mean is scaled by."""

    genes: tuple[str, ...]
    factors: tuple[float, ...]

    def log2_factors(self) -> dict[str, float]:
        """gene -> log2(factor): the planted log2 fold change of the gene's mean count."""
        return {g: float(np.log2(f)) for g, f in zip(self.genes, self.factors, strict=True)}


@dataclass(frozen=True)
class ScreenDraw:
    """One draw of a screen: counts (cells, genes), a label per cell, the source row per cell."""

    counts: np.ndarray
    labels: np.ndarray
    source_rows: np.ndarray


def plan_effects(
    genes: Sequence[str],
    gene_means: np.ndarray,
    *,
    n_perturbations: int,
    genes_per_perturbation: int,
    seed: int,
    min_mean: float = 0.5,
) -> dict[str, PlantedEffect]:
    """Perturbation name -> planted effect; names ``SYN-P01``.. say they are synthetic.

    Target genes are drawn without replacement among genes with a pool mean count >=
    ``min_mean`` (thinning a gene that is almost never seen plants nothing measurable), so no
    two perturbations share a gene and each has a profile of its own; half of each set goes
    down, half up (odd sets: one more down).
    """
    if n_perturbations < 1:
        raise ValueError(f"`n_perturbations` must be >= 1, got {n_perturbations}.")
    if genes_per_perturbation < 1:
        raise ValueError(f"`genes_per_perturbation` must be >= 1, got {genes_per_perturbation}.")
    gene_means = np.asarray(gene_means, dtype=np.float64)
    candidates = np.flatnonzero(gene_means >= min_mean)
    needed = n_perturbations * genes_per_perturbation
    if len(candidates) < needed:
        raise ValueError(
            f"{n_perturbations} perturbations x {genes_per_perturbation} genes need {needed} "
            f"genes with mean count >= {min_mean}, the pool has {len(candidates)}; plant fewer "
            "genes or perturbations."
        )
    rng = np.random.default_rng(seed)
    chosen = rng.choice(candidates, size=needed, replace=False)
    effects = {}
    for p in range(n_perturbations):
        rows = chosen[p * genes_per_perturbation : (p + 1) * genes_per_perturbation]
        n_down = (genes_per_perturbation + 1) // 2
        down = np.exp(rng.uniform(*np.log(DOWN_FACTORS), size=n_down))
        up = np.exp(rng.uniform(*np.log(UP_FACTORS), size=genes_per_perturbation - n_down))
        factors = np.round(np.concatenate([down, up]), 3)
        effects[f"SYN-P{p + 1:02d}"] = PlantedEffect(
            genes=tuple(str(genes[i]) for i in rows), factors=tuple(float(f) for f in factors)
        )
    return effects


def apply_effect(
    counts: np.ndarray,
    columns: np.ndarray,
    factors: np.ndarray,
    gene_shares: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """A copy of ``counts`` (cells, genes) with each column in ``columns`` scaled by its factor.

    ``gene_shares`` (genes,): each gene's share of all pool counts, for the Poisson rate of an
    up factor (see the module docstring).
    """
    out = np.array(counts, dtype=np.int64)  # (N, G)
    library = out.sum(axis=1)  # (N,) before any change, as the rate's cell size
    for column, factor in zip(columns, factors, strict=True):
        if factor < 1.0:
            out[:, column] = rng.binomial(out[:, column], factor)
        elif factor > 1.0:
            rate = (factor - 1.0) * library * gene_shares[column]  # (N,)
            out[:, column] += rng.poisson(rate)
    return out


def split_pool(n_cells: int, parts: int, seed: int) -> list[np.ndarray]:
    """``parts`` disjoint sets of pool rows (a seeded shuffle cut in near-equal parts): screens
    drawn from different parts share no real cell, so one can stand in for generated cells
    (or fit a PCA) without being in-sample for another."""
    if parts < 1 or n_cells < parts:
        raise ValueError(f"cannot cut {n_cells} pool cells into {parts} parts; use fewer parts.")
    return [
        np.sort(p) for p in np.array_split(np.random.default_rng(seed).permutation(n_cells), parts)
    ]


def draw_screen(
    pool: np.ndarray,
    genes: Sequence[str],
    effects: dict[str, PlantedEffect],
    *,
    cells_per_perturbation: int,
    n_control: int,
    seed: int,
    control_label: str = CONTROL_LABEL,
) -> ScreenDraw:
    """Real pool cells (cells, genes) dealt without replacement to the control and to each
    perturbation, which then gets its planted effect; rows ordered control first."""
    pool = np.asarray(pool)
    n_needed = n_control + cells_per_perturbation * len(effects)
    if cells_per_perturbation < 1 or n_control < 2:
        raise ValueError(
            "`cells_per_perturbation` must be >= 1 and `n_control` >= 2, got "
            f"{cells_per_perturbation} and {n_control}."
        )
    if n_needed > pool.shape[0]:
        raise ValueError(
            f"the screen needs {n_needed} distinct real cells ({n_control} control + "
            f"{len(effects)} x {cells_per_perturbation}), the pool has {pool.shape[0]}; lower "
            "`cells_per_perturbation` or `n_control`."
        )
    column_of = {str(g): i for i, g in enumerate(genes)}
    missing = [g for e in effects.values() for g in e.genes if g not in column_of]
    if missing:
        raise ValueError(f"planted genes {missing[:5]} are not in the pool's genes.")
    rng = np.random.default_rng(seed)
    rows = rng.permutation(pool.shape[0])[:n_needed]
    shares = pool.sum(axis=0) / max(float(pool.sum()), 1.0)  # (G,)
    blocks = [np.asarray(pool[rows[:n_control]], dtype=np.int64)]
    labels = [np.full(n_control, control_label, dtype=object)]
    for p, (name, effect) in enumerate(effects.items()):
        start = n_control + p * cells_per_perturbation
        base = pool[rows[start : start + cells_per_perturbation]]
        columns = np.array([column_of[g] for g in effect.genes])
        blocks.append(apply_effect(base, columns, np.array(effect.factors), shares, rng))
        labels.append(np.full(cells_per_perturbation, name, dtype=object))
    return ScreenDraw(np.vstack(blocks), np.concatenate(labels), rows)


def planted_truth_uns(
    effects: dict[str, PlantedEffect], *, control_label: str, plan_seed: int, draw_seed: int
) -> dict[str, object]:
    """What a screen's ``uns`` records: that it is semi-synthetic, the scale, the planted truth."""
    return {
        "semi_synthetic": True,
        "description": SEMI_SYNTHETIC_NOTE,
        "scale": "counts",
        "control_label": control_label,
        "plan_seed": plan_seed,
        "draw_seed": draw_seed,
        "planted_truth": {
            name: {"genes": list(e.genes), "factors": list(e.factors)}
            for name, e in effects.items()
        },
    }
