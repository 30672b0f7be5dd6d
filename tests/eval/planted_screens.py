"""A small SEMI-SYNTHETIC screen for the perturbation-report tests: the bundled PBMC counts (100
most expressed genes) cut in three disjoint thirds, one "real" screen, one redraw of the same
plan standing in for generated cells, one training screen for the PCA fit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import numpy as np

from sedd.eval.planted_screen import (
    PlantedEffect,
    ScreenDraw,
    draw_screen,
    plan_effects,
    split_pool,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "pbmc68k_counts.h5ad"


@dataclass(frozen=True)
class SmallScreen:
    genes: list[str]
    effects: dict[str, PlantedEffect]
    real: ScreenDraw
    redraw: ScreenDraw
    train: ScreenDraw


def small_screen(n_genes: int = 100, cells: int = 30, n_control: int = 60) -> SmallScreen:
    source = ad.read_h5ad(DATA)
    counts = source.X.toarray()
    top = np.argsort(-counts.mean(axis=0))[:n_genes]
    pool, genes = counts[:, top], [str(g) for g in source.var_names[top]]
    effects = plan_effects(
        genes, pool.mean(axis=0), n_perturbations=4, genes_per_perturbation=6, seed=0
    )
    real, redraw, train = (
        draw_screen(
            pool[rows], genes, effects, cells_per_perturbation=cells, n_control=n_control, seed=i
        )
        for i, rows in enumerate(split_pool(len(pool), 3, seed=0))
    )
    return SmallScreen(genes, effects, real, redraw, train)
