"""An .h5ad that reads other files is refused before anything is read: external raw storage,
external links and virtual datasets would copy any local file (an API key, /proc/self/environ)
into the cells. Each entry point says so in one line naming the file and the object."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest

from sedd.checkpoints import CheckpointError
from sedd.checkpoints.labels import read_gene_list
from sedd.cli import main
from sedd.defaults import DEFAULT_MODEL
from sedd.io.hdf5_safety import ExternalDataError, NotHdf5Error, check_self_contained
from sedd.io.read import read_counts, read_h5ad_safely

SECRET = b"SEDD_API_KEY=sk-7f3a9c1e"  # 24 bytes: the (3, 8) uint8 X a hostile file maps onto
SHAPE = (3, 8)
GENES = json.loads((DEFAULT_MODEL / "config.json").read_text())["genes"][: SHAPE[1]]


def _clean(path: Path) -> Path:
    """Three cells of eight model genes, labelled as the bundled model's cells are."""
    ad.AnnData(
        X=np.arange(np.prod(SHAPE), dtype=np.uint8).reshape(SHAPE) % 5,
        obs=pd.DataFrame({"bulk_labels": ["CD19+ B", "Dendritic", "CD19+ B"]}, index=list("abc")),
        var=pd.DataFrame(index=GENES),
    ).write_h5ad(path)
    return path


def _secret_sources(tmp_path: Path) -> tuple[Path, Path]:
    """The secret as a plain file, and as an HDF5 dataset (what links and views can reach)."""
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as file:
        file["secret"] = np.frombuffer(SECRET, dtype=np.uint8).reshape(SHAPE)
        file["secret"].attrs.update({"encoding-type": "array", "encoding-version": "0.2.0"})
    return secret, other


def _replace_x(path: Path, make: Callable[[h5py.File, str], None]) -> None:
    with h5py.File(path, "r+") as file:
        attrs = dict(file["X"].attrs)
        del file["X"]
        make(file, "X")
        if isinstance(file.get("X", getlink=True), h5py.HardLink):
            file["X"].attrs.update(attrs)


def _external_storage(tmp_path: Path, path: Path) -> str:
    secret, _ = _secret_sources(tmp_path)
    _replace_x(path, lambda f, name: f.create_dataset(
        name, shape=SHAPE, dtype="u1", external=[(str(secret), 0, len(SECRET))]
    ))  # fmt: skip
    return f"dataset /X keeps its values in other files (HDF5 external storage: {secret})"


def _external_link(tmp_path: Path, path: Path) -> str:
    _, other = _secret_sources(tmp_path)
    _replace_x(path, lambda f, name: f.__setitem__(name, h5py.ExternalLink(str(other), "/secret")))
    return f"/X is an HDF5 external link to /secret in {other}"


def _virtual_dataset(tmp_path: Path, path: Path) -> str:
    _, other = _secret_sources(tmp_path)
    layout = h5py.VirtualLayout(shape=SHAPE, dtype="u1")
    layout[:] = h5py.VirtualSource(str(other), "secret", shape=SHAPE)
    _replace_x(path, lambda f, name: f.create_virtual_dataset(name, layout))
    return "dataset /X is an HDF5 virtual dataset (its values are mapped from other datasets"


TAMPERINGS = {
    "external-storage": _external_storage,
    "external-link": _external_link,
    "virtual-dataset": _virtual_dataset,
}


@pytest.fixture(params=list(TAMPERINGS))
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """(a tampered .h5ad whose X is the secret, the words that name its offending object)."""
    path = _clean(tmp_path / "cells.h5ad")
    return path, TAMPERINGS[request.param](tmp_path, path)


def _assert_refused_in_one_line(text: str, head: str, reason: str) -> None:
    assert text.startswith(head) and reason in text, text
    assert text.count("\n") <= 1 and "Traceback" not in text
    assert SECRET.decode() not in text


def test_plain_anndata_reads_the_secret_from_each_tampered_file(hostile: tuple[Path, str]):
    """The threat, pinned: unchecked, each file's X is the secret's bytes."""
    path, _ = hostile
    assert ad.read_h5ad(path).X.tobytes() == SECRET


def test_each_tampered_file_is_refused_naming_the_file_and_the_object(
    hostile: tuple[Path, str],
):
    path, reason = hostile
    for read in (
        lambda: read_h5ad_safely(path, what="--data"),
        lambda: read_h5ad_safely(path, what="--data", backed="r"),
    ):
        with pytest.raises(ExternalDataError) as caught:
            read()
        _assert_refused_in_one_line(str(caught.value), f"--data {path}: ", reason)
        assert str(caught.value).endswith(
            "nothing was read; pass an .h5ad that holds all of its own data (anndata writes one)."
        )
    with pytest.raises(ExternalDataError, match=r"^h5ad file .*cells\.h5ad: "):
        read_counts(path)  # the library's reader (training, quality, the Python API)


def test_sedd_impute_refuses_with_exit_2_and_writes_nothing(
    hostile: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path, reason = hostile
    out = tmp_path / "imputed.h5ad"
    argv = ["impute", "--data", str(path), "--steps", "1", "--seed", "0", "--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    _assert_refused_in_one_line(captured.err, f"sedd impute: error: --data {path}: ", reason)
    assert SECRET.decode() not in captured.out
    assert not out.exists()


def test_generate_like_a_virtual_dataset_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = _clean(tmp_path / "like.h5ad")
    reason = _virtual_dataset(tmp_path, path)
    out = tmp_path / "generated.h5ad"
    argv = ["generate", "--like", str(path), "--condition-key", "bulk_labels", "--steps", "1"]
    assert main([*argv, "--device", "cpu", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    _assert_refused_in_one_line(captured.err, f"sedd generate: error: `like` {path}: ", reason)
    assert SECRET.decode() not in captured.out
    assert not out.exists()


def test_evaluate_refuses_real_cells_behind_an_external_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    real = _clean(tmp_path / "real.h5ad")
    reason = _external_link(tmp_path, real)
    generated = _clean(tmp_path / "generated.h5ad")
    out_dir = tmp_path / "eval"
    argv = ["evaluate", "--real", str(real), "--generated", str(generated)]
    assert main([*argv, "--out-dir", str(out_dir)]) == 2
    captured = capsys.readouterr()
    _assert_refused_in_one_line(captured.err, f"sedd evaluate: error: --real {real}: ", reason)
    assert SECRET.decode() not in captured.out
    assert not out_dir.exists()


def test_a_gene_list_h5ad_with_external_storage_is_refused(tmp_path: Path):
    path = _clean(tmp_path / "genes.h5ad")
    reason = _external_storage(tmp_path, path)
    with pytest.raises(CheckpointError) as caught:
        read_gene_list(path, len(GENES))
    _assert_refused_in_one_line(str(caught.value), f"gene list {path}: ", reason)


def test_an_external_link_anywhere_in_the_file_is_refused(tmp_path: Path):
    path = _clean(tmp_path / "cells.h5ad")
    _, other = _secret_sources(tmp_path)
    with h5py.File(path, "r+") as file:
        file["uns"]["notes"] = h5py.ExternalLink(str(other), "/")
    with pytest.raises(ExternalDataError, match=r": /uns/notes is an HDF5 external link to / in "):
        check_self_contained(path, "--data")


def test_soft_links_pass_when_they_stay_inside_the_file(tmp_path: Path):
    path = _clean(tmp_path / "cells.h5ad")
    with h5py.File(path, "r+") as file:
        file["uns"]["alias"] = h5py.SoftLink("/X")  # reached by plain links: read as usual
    adata = read_h5ad_safely(path, what="--data")
    np.testing.assert_array_equal(adata.uns["alias"], adata.X)
    with h5py.File(path, "r+") as file:
        file["uns"]["dangling"] = h5py.SoftLink("/nowhere/X")
    with pytest.raises(ExternalDataError) as caught:
        check_self_contained(path, "--data")
    assert str(caught.value).startswith(
        f"--data {path}: /uns/dangling is a soft link to /nowhere/X, which plain links inside "
        "the file do not reach; nothing was read"
    )


def test_a_file_that_is_not_hdf5_keeps_its_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = tmp_path / "cells.h5ad"
    path.write_bytes(b"gene,cell\nCD3E,4\n")
    with pytest.raises(NotHdf5Error, match=r"file signature not found"):
        read_h5ad_safely(path, what="--data")
    out = tmp_path / "imputed.h5ad"
    assert main(["impute", "--data", str(path), "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sedd impute: error: --data {path} is not an HDF5 file (")
    assert err.endswith("; pass an .h5ad written by anndata.\n") and err.count("\n") == 1
    assert not out.exists()
