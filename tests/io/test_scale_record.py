"""Every .h5ad sedd writes says its scale: ``uns["sedd"]["scale"] == "counts"`` (issue 47,
item 4), so no reader has to guess whether ``.X`` holds counts or log1p values."""

from __future__ import annotations

from pathlib import Path

import anndata
import numpy as np

from sedd.io import cell_writer
from sedd.io.write import COUNT_SCALE, provenance_uns, write_cells_h5ad

GENES = ["a", "b", "c"]


def record() -> dict:
    return provenance_uns(
        sampler="euler",
        steps=2,
        seed=0,
        temperature=1.0,
        precision_record={"device": "cpu"},
        checkpoint_hash="",
        timings={},
    )


def test_written_cells_record_the_counts_scale(tmp_path: Path) -> None:
    counts = np.array([[0, 1, 2], [3, 0, 1]])
    path = write_cells_h5ad(tmp_path / "x.h5ad", counts, GENES, {"label": ["p", "q"]}, record())
    assert anndata.read_h5ad(path).uns["sedd"]["scale"] == COUNT_SCALE == "counts"


def test_cells_written_batch_by_batch_record_the_counts_scale(tmp_path: Path) -> None:
    path = tmp_path / "y.h5ad"
    with cell_writer.CellWriter(path, GENES) as writer:
        writer.add(np.array([[1, 0, 2]]))
        writer.finish({"label": ["p"]}, record())
    assert anndata.read_h5ad(path).uns["sedd"]["scale"] == "counts"
