"""Counts <-> tokens, AnnData in/out, and the bundled pbmc68k counts."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import warnings
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from arrays import dense

from sedd.io.read import GeneAlignmentWarning, align_genes, read_counts
from sedd.io.tokens import (
    CountClipWarning,
    CountRangeError,
    TokenizedCells,
    counts_to_tokens,
    tokens_to_counts,
)
from sedd.io.write import provenance_uns, write_cells_h5ad

DATA = Path(__file__).resolve().parents[2] / "data"
GENES = ["CD3E", "MS4A1", "LYZ", "NKG7", "GNLY"]


def small_counts(seed: int = 0, n_cells: int = 8, max_count: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, max_count + 1, size=(n_cells, len(GENES)))
    counts[rng.random(counts.shape) < 0.5] = 0  # sparse, like real UMI data
    counts[0, 0] = max_count
    return counts


# --- counts <-> tokens -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "csr", "torch", "float"])
def test_counts_tokens_round_trip_is_identity(kind: str) -> None:
    counts = small_counts()
    source = {
        "numpy": counts,
        "csr": sp.csr_matrix(counts),
        "torch": torch.from_numpy(counts),
        "float": counts.astype(np.float32),
    }[kind]
    cells = counts_to_tokens(source, num_bins=7, genes=GENES)
    assert cells.tokens.dtype == torch.int64
    assert cells.tokens.shape == (8, 5)
    assert cells.genes == GENES
    assert cells.n_clipped == 0
    back = tokens_to_counts(cells.tokens, mask_index=7)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, counts)


def test_mask_token_is_num_bins_and_never_a_count() -> None:
    counts = np.array([[0, 1, 2, 3, 4]])  # every count a 5-bin model can represent
    cells = counts_to_tokens(counts, num_bins=5, genes=GENES)
    assert cells.tokens.max().item() == 4
    assert not (cells.tokens == 5).any()
    with pytest.raises(CountRangeError):
        counts_to_tokens(np.array([[0, 0, 5, 0, 0]]), num_bins=5, genes=GENES)


def test_count_equal_to_num_bins_raises_naming_gene_cell_and_clip() -> None:
    counts = np.zeros((3, 5), dtype=np.int64)
    counts[1, 2] = 9
    counts[2, 4] = 12
    with pytest.raises(CountRangeError) as info:
        counts_to_tokens(sp.csr_matrix(counts), num_bins=9, genes=GENES)
    message = str(info.value)
    assert "2 count value(s)" in message
    assert "max count 12" in message
    assert "cell 1, gene 'LYZ'" in message
    assert "0..8" in message
    assert "clip=True" in message and "--clip" in message
    assert isinstance(info.value, ValueError)


def test_clip_clips_to_top_bin_and_reports_n_clipped_exactly() -> None:
    counts = np.array([[0, 3, 4, 10, 2], [7, 1, 0, 0, 5]])
    with pytest.warns(CountClipWarning, match="clipped 3 count value"):
        cells = counts_to_tokens(torch.from_numpy(counts), num_bins=5, genes=GENES, clip=True)
    assert cells.n_clipped == 3
    expected = np.array([[0, 3, 4, 4, 2], [4, 1, 0, 0, 4]])
    np.testing.assert_array_equal(tokens_to_counts(cells.tokens, mask_index=5), expected)
    assert counts[0, 3] == 10  # the caller's array is not modified


def test_clip_without_out_of_range_counts_is_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cells = counts_to_tokens(small_counts(), num_bins=7, genes=GENES, clip=True)
    assert cells.n_clipped == 0


def test_tokens_to_counts_refuses_mask_token() -> None:
    tokens = torch.tensor([[0, 1, 5, 2], [5, 0, 0, 1]])
    with pytest.raises(ValueError, match=r"2 position\(s\) still hold the mask token 5"):
        tokens_to_counts(tokens, mask_index=5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokens_to_counts(torch.tensor([[0, 6]]), mask_index=5)
    with pytest.raises(ValueError, match="integer dtype"):
        tokens_to_counts(torch.tensor([[0.0, 1.0]]), mask_index=5)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (-1, "non-negative; found 1 negative value"),
        (1.5, "integers; found 1 non-integer value"),
        (np.nan, "finite"),
    ],
)
def test_negative_non_integer_and_nan_counts_are_rejected(bad: float, match: str) -> None:
    counts = small_counts().astype(np.float64)
    counts[3, 1] = bad
    with pytest.raises(ValueError, match=match) as info:
        counts_to_tokens(counts, num_bins=7, genes=GENES)
    assert "cell 3, gene 'MS4A1'" in str(info.value)
    assert not isinstance(info.value, CountRangeError)


def test_gene_names_must_match_columns() -> None:
    with pytest.raises(ValueError, match="genes has 4 names but counts has 5 columns"):
        counts_to_tokens(small_counts(), num_bins=7, genes=GENES[:4])
    with pytest.raises(ValueError, match="genes has 2 names but tokens has 3 columns"):
        TokenizedCells(tokens=torch.zeros(2, 3, dtype=torch.int64), genes=["a", "b"])
    with pytest.raises(ValueError, match="num_bins must be an integer >= 1"):
        counts_to_tokens(small_counts(), num_bins=0, genes=GENES)


# --- read_counts / align_genes -------------------------------------------------------------


def synthetic_adata(counts: np.ndarray) -> anndata.AnnData:
    obs = pd.DataFrame(
        {"cell_type": ["T", "B"] * (counts.shape[0] // 2)},
        index=[f"cell{i}" for i in range(counts.shape[0])],
    )
    return anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=GENES))


def test_read_counts_from_x_gives_int64_and_keeps_obs_var() -> None:
    counts = small_counts()
    adata = synthetic_adata(counts.astype(np.float32))
    out = read_counts(adata)
    assert out.X.dtype == np.int64
    np.testing.assert_array_equal(out.X, counts)
    assert list(out.var_names) == GENES
    assert list(out.obs["cell_type"]) == list(adata.obs["cell_type"])

    sparse = read_counts(synthetic_adata(sp.csr_matrix(counts)))
    assert sp.issparse(sparse.X) and sparse.X.dtype == np.int64
    np.testing.assert_array_equal(sparse.X.toarray(), counts)


def test_read_counts_from_layer_and_missing_layer_lists_layers() -> None:
    counts = small_counts()
    adata = synthetic_adata(np.log1p(counts).astype(np.float32))
    adata.layers["counts"] = sp.csr_matrix(counts)
    adata.layers["spliced"] = counts
    np.testing.assert_array_equal(read_counts(adata, layer="counts").X.toarray(), counts)
    with pytest.raises(ValueError, match=r"layer 'raw' not found.*\['counts', 'spliced'\]"):
        read_counts(adata, layer="raw")


def test_log_normalised_x_without_recovery_is_refused(tmp_path: Path) -> None:
    adata = synthetic_adata(np.log1p(small_counts()).astype(np.float32))
    adata.raw = adata
    with pytest.raises(ValueError, match="look log-normalised") as info:
        read_counts(adata)
    assert "recover='pbmc'" in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"nope\.h5ad"):
        read_counts(tmp_path / "nope.h5ad")


def test_recover_pbmc_gives_exact_counts_from_log_normalised_raw() -> None:
    counts = small_counts(n_cells=10, max_count=300)
    n_counts = counts.sum(axis=1) * 3.0 + 100.0  # library size over more genes than kept
    lognorm = np.log1p(counts / n_counts[:, None] * 1e4).astype(np.float32)
    raw = synthetic_adata(sp.csr_matrix(lognorm))
    adata = anndata.AnnData(
        X=np.zeros((10, 2), dtype=np.float32),  # a reduced, scaled .X with other genes
        obs=raw.obs.assign(n_counts=n_counts),
        var=pd.DataFrame(index=["PC_gene1", "PC_gene2"]),
    )
    adata.raw = raw
    out = read_counts(adata, recover="pbmc")
    assert out.X.dtype == np.int64
    np.testing.assert_array_equal(out.X.toarray(), counts)
    assert list(out.var_names) == GENES  # from .raw.var_names
    assert out.uns["count_recovery"]["max_abs_rounding_error"] < 0.01


def test_align_genes_reorders_and_names_missing_genes() -> None:
    counts = small_counts()
    adata = synthetic_adata(counts)
    order = ["GNLY", "CD3E", "LYZ"]
    with pytest.warns(GeneAlignmentWarning, match="dropping 2 gene"):
        aligned = align_genes(adata, order)
    assert list(aligned.var_names) == order
    np.testing.assert_array_equal(aligned.X, counts[:, [4, 0, 2]])
    with pytest.raises(ValueError, match=r"2 of the model's 3 genes are missing.*'FOO', 'BAR'"):
        align_genes(adata, ["CD3E", "FOO", "BAR"])


# --- the bundled dataset -------------------------------------------------------------------


def test_bundled_pbmc_counts_are_exact_integers_with_split() -> None:
    adata = anndata.read_h5ad(DATA / "pbmc68k_counts.h5ad")
    assert adata.shape == (700, 765)
    assert sp.issparse(adata.X) and np.issubdtype(adata.X.dtype, np.integer)
    assert adata.X.max() == 259
    assert np.mean(adata.X.data == 1) == pytest.approx(0.534, abs=0.001)
    labels, split = adata.obs["bulk_labels"].astype(str), adata.obs["split"].astype(str)
    assert labels.nunique() == 10
    assert set(split) == {"train", "test"}
    assert (split == "test").mean() == pytest.approx(0.15, abs=0.01)
    assert set(labels[split == "train"]) == set(labels)

    record = json.loads((DATA / "pbmc68k_split.json").read_text())
    assert record["seed"] == 0 and record["test_fraction"] == 0.15
    assert record["test"] == list(adata.obs_names[split == "test"])
    assert record["train"] == list(adata.obs_names[split == "train"])
    for path in DATA.glob("pbmc68k_*"):
        assert path.stat().st_size < 1.5e6, path


# --- write_cells_h5ad ----------------------------------------------------------------------


def provenance() -> dict:
    return provenance_uns(
        sampler="euler",
        steps=16,
        seed=3,
        temperature=1.0,
        precision_record={"amp_dtype": "bf16", "device": "cpu", "tf32": False, "note": None},
        checkpoint_hash="sha256:abc123",
        timings={"total_s": np.float32(1.25), "per_step_s": (0.1, 0.2)},
        extra={"num_bins": np.int64(7), "labels": ["T", "B"], "cell_types": ["T", None]},
    )


def test_write_cells_h5ad_round_trips_genes_obs_and_provenance(tmp_path: Path) -> None:
    counts = small_counts()
    obs = {
        "perturbation": ["ctrl", "KO"] * 4,
        "cell_type": ["T"] * 8,
        "sample_idx": np.arange(8),
    }
    path = write_cells_h5ad(
        tmp_path / "cells.h5ad", torch.from_numpy(counts), GENES, obs, provenance()
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cells.h5ad"]  # no temp file left
    back = anndata.read_h5ad(path)
    assert list(back.var_names) == GENES
    assert back.X.dtype == np.int32
    dense = back.X.toarray() if sp.issparse(back.X) else back.X
    np.testing.assert_array_equal(dense, counts)
    assert isinstance(back.obs["perturbation"].dtype, pd.CategoricalDtype)
    assert list(back.obs["perturbation"]) == obs["perturbation"]
    assert list(back.obs["sample_idx"]) == list(range(8))
    sedd = back.uns["sedd"]
    assert sedd["sampler"] == "euler" and sedd["steps"] == 16 and sedd["seed"] == 3
    assert sedd["precision"]["amp_dtype"] == "bf16"
    assert sedd["precision"]["note"] is None  # a real null, not the string "None"
    assert bool(sedd["precision"]["tf32"]) is False
    assert sedd["timings"]["total_s"] == pytest.approx(1.25)
    assert list(sedd["timings"]["per_step_s"]) == pytest.approx([0.1, 0.2])
    assert sedd["num_bins"] == 7
    assert sedd["cell_types"] == {"0": "T", "1": None}  # a list holding null, keyed by position
    assert sedd["versions"]["torch"] == importlib.metadata.version("torch")
    assert sedd["versions"]["sedd"] == importlib.metadata.version("sedd")
    assert sedd["created_utc"].endswith("+00:00")
    assert socket.gethostname() not in repr(back.uns)


@pytest.mark.parametrize("num_genes", [5, 64, 765])
def test_write_cells_h5ad_writes_csr_int32_at_any_gene_count_and_density(
    tmp_path: Path, num_genes: int
) -> None:
    rng = np.random.default_rng(num_genes)
    sparse_counts = rng.integers(0, 4, size=(40, num_genes)) * (rng.random((40, num_genes)) < 0.1)
    dense_counts = rng.integers(1, 9, size=(6, num_genes))  # no zeros: dense would be smaller
    genes = [f"g{i}" for i in range(num_genes)]
    for name, counts in (("s", sparse_counts), ("d", sp.csr_matrix(dense_counts))):
        back = anndata.read_h5ad(write_cells_h5ad(tmp_path / f"{name}.h5ad", counts, genes, {}, {}))
        assert isinstance(back.X, sp.csr_matrix) and back.X.dtype == np.int32
        np.testing.assert_array_equal(back.X.toarray(), dense(counts))


def test_write_cells_h5ad_rejects_mismatched_genes_and_non_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be \\(cells, 4 genes\\)"):
        write_cells_h5ad(tmp_path / "x.h5ad", small_counts(), GENES[:4], {}, {})
    with pytest.raises(ValueError, match="not integer counts"):
        write_cells_h5ad(tmp_path / "x.h5ad", small_counts() + 0.5, GENES, {}, {})
    assert list(tmp_path.iterdir()) == []


def test_write_cells_h5ad_float32_keeps_the_integer_values(tmp_path: Path) -> None:
    counts = np.array([[0, 3, 0, 0], [7, 0, 0, 1]])
    path = write_cells_h5ad(
        tmp_path / "f.h5ad", counts, ["a", "b", "c", "d"], {}, {}, count_dtype="float32"
    )
    back = anndata.read_h5ad(path)
    matrix = back.X.toarray() if sp.issparse(back.X) else back.X
    assert matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix, counts)


def test_cell_writer_appends_batches_on_disk_and_reads_back_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sedd.io.cell_writer as out

    monkeypatch.setattr(out, "_FLUSH_NNZ", 7)  # an append every batch or two
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 4, size=(n, 5)) * (rng.random((n, 5)) < 0.5) for n in (3, 1, 4, 2)]
    path = tmp_path / "cells.h5ad"
    with out.CellWriter(path, [f"g{i}" for i in range(5)]) as writer:
        for batch in batches:
            writer.add(batch if len(batch) % 2 else sp.csr_matrix(batch))
        assert not path.exists()  # only the temp file until finish
        writer.finish({"label": ["a"] * 10}, {"sedd": {"seed": 3}})
    adata = anndata.read_h5ad(path)
    np.testing.assert_array_equal(adata.X.toarray(), np.concatenate(batches))
    assert adata.X.dtype == np.int32 and adata.X.indptr.dtype == np.int64
    assert list(adata.var_names) == [f"g{i}" for i in range(5)]
    assert list(adata.obs["label"]) == ["a"] * 10 and adata.uns["sedd"]["seed"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["cells.h5ad"]  # no temp file left


def test_cell_writer_leaves_nothing_behind_on_error(tmp_path: Path) -> None:
    import sedd.io.cell_writer as out

    path = tmp_path / "cells.h5ad"
    with pytest.raises(ValueError, match="counts must be"), out.CellWriter(path, ["a", "b"]) as w:
        w.add(np.ones((2, 3), dtype=np.int64))  # 3 genes for a 2-gene writer
    assert list(tmp_path.iterdir()) == []


def test_written_cells_record_the_counts_scale(tmp_path: Path) -> None:
    """Every .h5ad sedd writes says its scale (issue 47, item 4): no reader guesses whether
    ``.X`` holds counts or log1p values."""
    from sedd.io.write import COUNT_SCALE

    counts = np.array([[0, 1, 2, 0, 1], [3, 0, 1, 0, 0]])
    path = write_cells_h5ad(tmp_path / "x.h5ad", counts, GENES, {"label": ["p", "q"]}, provenance())
    assert anndata.read_h5ad(path).uns["sedd"]["scale"] == COUNT_SCALE == "counts"


def test_cells_written_batch_by_batch_record_the_counts_scale(tmp_path: Path) -> None:
    import sedd.io.cell_writer as out

    path = tmp_path / "y.h5ad"
    with out.CellWriter(path, GENES) as writer:
        writer.add(np.array([[1, 0, 2, 0, 0]]))
        writer.finish({"label": ["p"]}, provenance())
    assert anndata.read_h5ad(path).uns["sedd"]["scale"] == "counts"
