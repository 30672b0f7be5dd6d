"""PNG plots of a real-vs-generated comparison (matplotlib, Agg canvas, nothing displayed).

Figures are built on ``matplotlib.figure.Figure`` with an explicit Agg canvas rather than
through pyplot, so plotting neither needs a display nor changes the process's global backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.spatial.distance import squareform

from sedd.eval.metrics import EvaluationArrays

REAL_COLOUR = "#1f77b4"
GEN_COLOUR = "#d62728"
# Gene names per heatmap axis (more genes: every k-th one named), so the names stay readable.
MAX_LABELLED_GENES = 30
MAX_LEGEND_LABELS = 25  # labels listed in the PCA legend


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def plot_pca_overlay(
    real_pcs: np.ndarray,
    gen_pcs: np.ndarray,
    path: Path,
    *,
    explained_variance_ratio: Sequence[float] | None = None,
    real_labels: Sequence[str] | None = None,
    gen_labels: Sequence[str] | None = None,
) -> Path:
    """``pca_overlay_figure(...)`` written to ``path`` as PNG."""
    figure = pca_overlay_figure(
        real_pcs,
        gen_pcs,
        explained_variance_ratio=explained_variance_ratio,
        real_labels=real_labels,
        gen_labels=gen_labels,
    )
    return _save(figure, path)


def pca_overlay_figure(
    real_pcs: np.ndarray,
    gen_pcs: np.ndarray,
    *,
    explained_variance_ratio: Sequence[float] | None = None,
    real_labels: Sequence[str] | None = None,
    gen_labels: Sequence[str] | None = None,
) -> Figure:
    """Real and generated cells on the real-fitted PC1/PC2: coloured by source, and with labels
    (each set's condition of every row) a second panel coloured by label, real as dots and
    generated as crosses, so a condition's generated cells can be seen to land on its real ones."""
    if real_pcs.shape[1] < 2:
        raise ValueError(f"a PC1/PC2 overlay needs >= 2 components, got {real_pcs.shape[1]}.")
    labelled = real_labels is not None and gen_labels is not None
    fig = Figure(figsize=(12.5 if labelled else 6, 5))
    axes = fig.subplots(1, 2 if labelled else 1, sharex=True, sharey=True, squeeze=False)[0]
    size = 6 if len(real_pcs) + len(gen_pcs) > 2000 else 12
    by_source = axes[0]
    by_source.scatter(
        *real_pcs[:, :2].T, s=size, alpha=0.5, c=REAL_COLOUR, label=f"real ({len(real_pcs)})"
    )
    by_source.scatter(
        *gen_pcs[:, :2].T, s=size, alpha=0.5, c=GEN_COLOUR, label=f"generated ({len(gen_pcs)})"
    )
    by_source.set_title("PCA fitted on real cells")
    by_source.legend(markerscale=2, frameon=False)
    if labelled:
        _scatter_by_label(axes[1], real_pcs, gen_pcs, real_labels, gen_labels, size)
    ratios = explained_variance_ratio
    for ax in axes:
        for axis_label, set_label, i in (("PC1", ax.set_xlabel, 0), ("PC2", ax.set_ylabel, 1)):
            share = f" ({100 * ratios[i]:.1f}% of real variance)" if ratios is not None else ""
            set_label(axis_label + share)
    return fig


def _scatter_by_label(
    ax: Axes,
    real_pcs: np.ndarray,
    gen_pcs: np.ndarray,
    real_labels: Sequence[str],
    gen_labels: Sequence[str],
    size: float,
) -> None:
    real_labels, gen_labels = np.asarray(real_labels, str), np.asarray(gen_labels, str)
    if len(real_labels) != len(real_pcs) or len(gen_labels) != len(gen_pcs):
        raise ValueError(
            f"labels must give one name a row: {len(real_labels)} real labels for "
            f"{len(real_pcs)} rows, {len(gen_labels)} generated labels for {len(gen_pcs)} rows."
        )
    names = sorted(set(real_labels) | set(gen_labels))
    palette = colormaps["tab10" if len(names) <= 10 else "tab20"]
    for k, name in enumerate(names):
        colour = palette(k % palette.N)
        real, gen = real_pcs[real_labels == name, :2], gen_pcs[gen_labels == name, :2]
        ax.scatter(*real.T, s=size, alpha=0.4, color=colour, label=name)
        ax.scatter(*gen.T, s=size * 1.5, alpha=0.7, color=colour, marker="x", linewidths=0.8)
    ax.set_title(f"by label ({len(names)}): real dots, generated crosses")
    if len(names) <= MAX_LEGEND_LABELS:
        legend = {"loc": "center left", "bbox_to_anchor": (1.0, 0.5), "fontsize": 7}
        ax.legend(markerscale=2, frameon=False, **legend)


def plot_gene_means(
    real_means: np.ndarray, gen_means: np.ndarray, path: Path, *, pearson: float | None = None
) -> Path:
    """Per-gene mean log-normalised expression, generated against real, with the y = x line."""
    if pearson is None:
        with np.errstate(invalid="ignore", divide="ignore"):
            pearson = float(np.corrcoef(real_means, gen_means)[0, 1])  # NaN if one is constant
    fig = Figure(figsize=(5, 5))
    ax = fig.add_subplot()
    ax.scatter(real_means, gen_means, s=8, alpha=0.6, c=GEN_COLOUR, linewidths=0)
    top = float(max(real_means.max(), gen_means.max(), 1e-6)) * 1.05
    ax.plot([0, top], [0, top], color="black", linewidth=1, label="y = x")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("real mean log1p(normalised counts)")
    ax.set_ylabel("generated mean log1p(normalised counts)")
    ax.set_title(f"per-gene means ({len(real_means)} genes), Pearson r = {pearson:.3f}")
    ax.legend(frameon=False, loc="upper left")
    return _save(fig, path)


def _cluster_order(corr: np.ndarray) -> np.ndarray:
    # Average-linkage on 1 - r makes blocks of co-expressed genes visible; both panels share it.
    distance = np.clip(1.0 - corr, 0.0, 2.0)
    np.fill_diagonal(distance, 0.0)
    return leaves_list(linkage(squareform(distance, checks=False), method="average"))


def plot_correlation_matrices(
    real_corr: np.ndarray,
    gen_corr: np.ndarray,
    path: Path,
    *,
    genes: Sequence[str] | None = None,
) -> Path:
    """``correlation_figure(...)`` written to ``path`` as PNG."""
    return _save(correlation_figure(real_corr, gen_corr, genes=genes), path)


def correlation_figure(
    real_corr: np.ndarray, gen_corr: np.ndarray, *, genes: Sequence[str] | None = None
) -> Figure:
    """Gene-gene correlation heatmaps, real | generated (same gene order, colour scale -1..1)
    | generated - real, genes ordered by clustering the real matrix."""
    if real_corr.shape != gen_corr.shape:
        raise ValueError(f"matrices differ in shape: {real_corr.shape} vs {gen_corr.shape}.")
    order = _cluster_order(real_corr)
    real_corr, gen_corr = real_corr[np.ix_(order, order)], gen_corr[np.ix_(order, order)]
    diff = gen_corr - real_corr
    diff_scale = max(float(np.abs(diff).max()), 1e-6)
    fig = Figure(figsize=(17, 5.2))
    axes = fig.subplots(1, 3)
    panels = (
        ("real", real_corr, 1.0),
        ("generated", gen_corr, 1.0),
        ("generated - real", diff, diff_scale),
    )
    for k, (ax, (title, matrix, scale)) in enumerate(zip(axes, panels, strict=True)):
        image = ax.imshow(matrix, cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        ax.set_title(f"{title} ({len(matrix)} most variable real genes)", fontsize=10)
        if genes is not None:
            # the panels share one gene order: names on every x axis, on the first y axis only
            # (elsewhere they would run into the colour bar on their left)
            _gene_ticks(ax, [str(genes[i]) for i in order], name_rows=k == 0)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    return fig


def _gene_ticks(ax: Axes, names: list[str], *, name_rows: bool = True) -> None:
    """Gene names on the axes: every gene up to MAX_LABELLED_GENES, else every k-th one so that
    at most that many stay readable; ``name_rows=False`` keeps the y ticks unnamed."""
    step = max(1, -(-len(names) // MAX_LABELLED_GENES))  # ceil
    ticks = list(range(0, len(names), step))
    shown = [names[i] for i in ticks]
    ax.set_xticks(ticks, shown, rotation=90, fontsize=6)
    ax.set_yticks(ticks, shown if name_rows else [""] * len(ticks), fontsize=6)
    if step > 1:
        ax.set_xlabel(f"one gene in {step} named", fontsize=7)


def write_evaluation_plots(
    arrays: EvaluationArrays, out_dir: Path, *, pearson: float | None = None
) -> list[Path]:
    """pca_overlay.png, gene_means.png and correlation_matrices.png in ``out_dir``."""
    paths = []
    if arrays.real_pcs.shape[1] >= 2:
        paths.append(
            plot_pca_overlay(
                arrays.real_pcs,
                arrays.gen_pcs,
                out_dir / "pca_overlay.png",
                explained_variance_ratio=arrays.explained_variance_ratio,
                real_labels=arrays.real_pc_labels,
                gen_labels=arrays.gen_pc_labels,
            )
        )
    paths.append(
        plot_gene_means(
            arrays.real_gene_means,
            arrays.gen_gene_means,
            out_dir / "gene_means.png",
            pearson=pearson,
        )
    )
    paths.append(
        plot_correlation_matrices(
            arrays.real_corr,
            arrays.gen_corr,
            out_dir / "correlation_matrices.png",
            genes=arrays.corr_genes,
        )
    )
    return paths
