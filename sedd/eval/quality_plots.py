"""PNG plots of a quality report (``sedd.eval.quality_report``), on matplotlib's Agg canvas.

* ``umap.png``: the joint UMAP of real and generated cells, coloured by source and by label
  (the PCA overlay's layout, ``sedd.eval.plots.pca_overlay_figure``, on UMAP coordinates);
* ``markers_<label>.png``: per marker set, histograms of the label's real and generated cells'
  marker scores (mean log-normalised expression of the markers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sedd.eval.plots import GEN_COLOUR, REAL_COLOUR, pca_overlay_figure
from sedd.eval.quality_report import ReportArrays

MARKER_BINS = 30


def write_quality_plots(
    arrays: ReportArrays, marker_genes: Mapping[str, Sequence[str]], out_dir: Path
) -> list[Path]:
    """Write ``umap.png`` and one ``markers_<label>.png`` a marker set; return their paths."""
    embedding = arrays.embedding
    figure = pca_overlay_figure(
        embedding.real_umap,
        embedding.gen_umap,
        real_labels=arrays.real_labels,
        gen_labels=arrays.gen_labels,
    )
    by_source, by_label = figure.axes[:2]
    by_source.set_title("UMAP of real and generated cells, clustered together")
    by_label.set_title("by label: real dots, generated crosses")
    for ax in (by_source, by_label):
        ax.set_xlabel("UMAP1")
        ax.set_ylabel("UMAP2")
    paths = [_write_png(figure, out_dir / "umap.png")]
    for label, (real, gen) in arrays.marker_scores.items():
        figure = marker_figure(label, marker_genes[label], real, gen)
        paths.append(_write_png(figure, out_dir / f"markers_{_file_stem(label)}.png"))
    return paths


def marker_figure(
    label: str, genes: Sequence[str], real: np.ndarray, generated: np.ndarray
) -> Figure:
    """Histograms (density) of a label's real and generated marker scores on shared bins, with
    each set's median marked."""
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    top = float(max(real.max(initial=0.0), generated.max(initial=0.0), 1e-6))
    bins = np.linspace(0.0, top * 1.02, MARKER_BINS + 1)
    for scores, colour, name in ((real, REAL_COLOUR, "real"), (generated, GEN_COLOUR, "generated")):
        if len(scores) == 0:
            continue
        ax.hist(scores, bins=bins, density=True, alpha=0.45, color=colour,
                label=f"{name} ({len(scores)})")  # fmt: skip
        ax.axvline(float(np.median(scores)), color=colour, linewidth=1, linestyle="--")
    ax.set_xlabel(f"mean log1p(normalised counts) of {', '.join(genes)}")
    ax.set_ylabel("density")
    ax.set_title(f"{label}: marker score (dashed: medians)")
    ax.legend(frameon=False)
    return fig


def _file_stem(label: str) -> str:
    """A label as a file name part: ``CD19+ B`` -> ``CD19_B``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "label"


def _write_png(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
