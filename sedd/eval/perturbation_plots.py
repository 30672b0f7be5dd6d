"""The perturbation report's plot: per perturbation, generated against real log2 fold changes over
the genes the reference half calls significant, beside the cell-mean baseline's (matplotlib, Agg
canvas, nothing displayed). Points on the diagonal are a recovered response; a cloud flatter
than it is the shrinkage ``lfc_slope`` measures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LFC_PLOT = "lfc_scatter.png"
# (method column of de_tables, legend label, colour)
SERIES = (
    ("lfc_model", "model", "tab:blue"),
    ("lfc_cell_mean_baseline", "cell-mean baseline", "tab:grey"),
)


def most_significant(de_rows: list[dict[str, Any]], n: int) -> list[str]:
    """The ``n`` perturbations with the most significant genes (ties by name)."""
    found: dict[str, int] = {}
    for row in de_rows:
        found[row["perturbation"]] = found.get(row["perturbation"], 0) + int(row["significant"])
    return sorted(found, key=lambda pert: (-found[pert], pert))[:n]


def write_lfc_scatter(de_rows: list[dict[str, Any]], path: Path, n_panels: int = 2) -> Path | None:
    """One panel per perturbation (the ``n_panels`` with the most significant genes): each
    method's LFC (y) against the real one (x) over the significant genes. None if none has any."""
    perts = [p for p in most_significant(de_rows, n_panels) if _significant(de_rows, p)]
    if not perts:
        return None
    fig = Figure(figsize=(4.2 * len(perts), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    for index, pert in enumerate(perts):
        ax = fig.add_subplot(1, len(perts), index + 1)
        rows = _significant(de_rows, pert)
        real = np.array([r["lfc_real"] for r in rows], dtype=float)
        limit = 0.0
        for column, label, colour in SERIES:
            values = np.array([r[column] for r in rows], dtype=float)
            ax.scatter(real, values, s=10, alpha=0.7, color=colour, label=label)
            limit = max(limit, float(np.nanmax(np.abs(values))))
        limit = max(limit, float(np.abs(real).max())) * 1.05
        ax.plot([-limit, limit], [-limit, limit], color="black", linewidth=0.8, linestyle="--")
        ax.axhline(0.0, color="lightgrey", linewidth=0.6)
        ax.set(xlim=(-limit, limit), ylim=(-limit, limit), title=f"{pert} ({len(rows)} genes)")
        ax.set(xlabel="real log2 FC (reference half vs control)", ylabel="predicted log2 FC")
        ax.legend(loc="upper left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _significant(de_rows: list[dict[str, Any]], pert: str) -> list[dict[str, Any]]:
    return [r for r in de_rows if r["perturbation"] == pert and r["significant"]]
