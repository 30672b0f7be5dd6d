"""st3's inference_perturbseq scores: each generated cell against a held-out cell of its label."""

from __future__ import annotations

from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from sedd.eval.st3 import HeldOutReference, st3_paired_scores

GENES = ["g0", "g1", "g2", "g3"]


def _reference(counts: list[list[int]], labels: list[str]) -> HeldOutReference:
    return HeldOutReference(
        path=Path("real.h5ad"), key="perturbation", genes=GENES,
        counts=sp.csr_matrix(np.array(counts)), cell_labels=np.array(labels),
        rest_counts=None, split=None,
    )  # fmt: skip


def _generated(path: Path, counts: list[list[int]], labels: list[str]) -> Path:
    obs = pd.DataFrame({"condition": labels}, index=[f"c{i}" for i in range(len(labels))])
    adata = anndata.AnnData(X=sp.csr_matrix(np.array(counts, dtype=np.int32)), obs=obs,
                            var=pd.DataFrame(index=GENES))  # fmt: skip
    adata.write_h5ad(path)
    return path


def test_cells_pair_within_their_label_in_file_order_and_extras_are_not_scored(
    tmp_path: Path,
) -> None:
    reference = _reference(
        [[0, 1, 2, 3], [5, 5, 5, 5], [9, 9, 9, 9], [1, 1, 1, 1]], ["A", "B", "A", "B"]
    )
    generated = _generated(
        tmp_path / "gen.h5ad",
        # B's first pairs with real row 1, A's first with row 0, A's second with row 2; the
        # third A has no held-out partner.
        [[5, 5, 5, 5], [0, 1, 2, 7], [9, 9, 9, 0], [3, 3, 3, 3]],
        ["B", "A", "A", "A"],
    )
    scores = st3_paired_scores(reference, generated)
    # errors: B row -> 0,0,0,0; A first -> 0,0,0,4; A second -> 0,0,0,9
    assert scores["num_cells"] == 3
    assert scores["exact_cell_match"] == pytest.approx(1 / 3)
    assert scores["per_gene_accuracy"] == pytest.approx(10 / 12)
    assert scores["mae_bins"] == pytest.approx(13 / 12)
    assert scores["within_k"] == pytest.approx({"1": 10 / 12, "3": 10 / 12, "5": 11 / 12,
                                                "10": 1.0})  # fmt: skip


def test_no_shared_label_is_a_clear_error(tmp_path: Path) -> None:
    reference = _reference([[0, 0, 0, 0]], ["A"])
    generated = _generated(tmp_path / "gen.h5ad", [[0, 0, 0, 0]], ["Z"])
    with pytest.raises(ValueError, match="nothing to pair"):
        st3_paired_scores(reference, generated)
