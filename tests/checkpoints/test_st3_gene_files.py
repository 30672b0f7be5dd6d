"""Gene names beside an st3 experiment's checkpoints: ``genes.json`` (a list, or
{name: index}) names the genes by default, before ``genes.txt``; ``--genes`` wins over both; a
file of the wrong length stops the load in one line that names it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import anndata
import pytest
from checkpoint_files import ST3, copy_tree, gene_file

import sedd
from sedd.checkpoints import CheckpointError, load_checkpoint
from sedd.checkpoints.labels import PositionalGenesWarning
from sedd.cli import main

NAMES = [f"ENSG{i:05d}" for i in range(64)]  # tiny_mlm has 64 genes


def _experiment(tmp_path: Path, genes_json: object | None = None) -> Path:
    """A writable copy of the tiny_mlm st3 experiment, with ``genes.json`` holding
    ``genes_json`` when given."""
    exp = copy_tree(ST3 / "tiny_mlm", tmp_path / "tiny_mlm")
    if genes_json is not None:
        (exp / "genes.json").write_text(json.dumps(genes_json))
    return exp


def _generate(exp: Path, out: Path, *extra: str) -> int:
    argv = ["generate", "--model", str(exp), "--cells", "2", "--steps", "2", "--seed", "0"]
    return main([*argv, "--precision", "fp32", "--device", "cpu", "--out", str(out), *extra])


def test_genes_json_list_names_the_genes_without_the_positional_warning(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, NAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PositionalGenesWarning)
        loaded = load_checkpoint(exp)
    assert loaded.config.genes == NAMES and not loaded.config.genes_by_position
    assert loaded.config.provenance.genes_file == str(exp / "genes.json")


def test_genes_json_name_to_index_mapping_orders_genes_by_index(tmp_path: Path) -> None:
    mapping = {name: i for i, name in reversed(list(enumerate(NAMES)))}  # keys in reverse order
    loaded = load_checkpoint(_experiment(tmp_path, mapping))
    assert loaded.config.genes[:2] == ["ENSG00000", "ENSG00001"]
    assert loaded.config.genes[-1] == "ENSG00063"


def test_library_load_gives_cells_named_by_genes_json(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, NAMES)
    cells = sedd.load(exp, device="cpu", precision="fp32").generate(2, steps=2, seed=0)
    assert list(cells.var_names) == NAMES and cells.shape == (2, 64)
    assert cells.uns["sedd"]["genes_by_position"] is False
    assert cells.uns["sedd"]["genes_file"] == str(exp / "genes.json")


def test_sedd_generate_names_genes_from_genes_json(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, NAMES)
    assert _generate(exp, tmp_path / "cells.h5ad") == 0
    cells = anndata.read_h5ad(tmp_path / "cells.h5ad")
    assert list(cells.var_names) == NAMES
    assert cells.uns["sedd"]["genes_file"] == str(exp / "genes.json")


def test_genes_json_is_read_before_genes_txt(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, NAMES)
    gene_file(exp)  # genes.txt: GENE0..GENE63
    assert load_checkpoint(exp).config.genes == NAMES
    (exp / "genes.json").unlink()
    txt = load_checkpoint(exp).config
    assert txt.genes[:2] == ["GENE0", "GENE1"]
    assert txt.provenance.genes_file == str(exp / "genes.txt")


def test_explicit_genes_win_over_genes_json_even_a_wrong_one(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, NAMES[:63])  # one name short: never read when --genes is given
    given = gene_file(tmp_path)  # GENE0..GENE63
    loaded = load_checkpoint(exp, genes=given)
    assert loaded.config.genes[-1] == "GENE63"
    assert loaded.config.provenance.genes_file == str(given)

    exp = _experiment(tmp_path / "ok", NAMES)
    assert _generate(exp, tmp_path / "cells.h5ad", "--genes", str(given)) == 0
    cells = anndata.read_h5ad(tmp_path / "cells.h5ad")
    assert list(cells.var_names)[:2] == ["GENE0", "GENE1"]
    assert cells.uns["sedd"]["genes_file"] == str(given)


def test_wrong_length_genes_json_is_a_one_line_error_naming_file_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment(tmp_path, NAMES[:63])
    expected = (
        f"gene list {exp / 'genes.json'} has 63 names but the model has 64 genes; it sits next "
        "to the checkpoint, so it is read as the gene list by default: make it list the model's "
        "64 genes in training order, or pass --genes FILE (sedd.load(..., genes=FILE)) to use "
        "another list."
    )
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(exp)
    assert str(err.value) == expected

    out = tmp_path / "cells.h5ad"
    assert _generate(exp, out) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"sedd generate: error: {expected}"]
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"genes": NAMES},
            r"must hold a JSON list of gene names in model order, or \{name: index\}; found an "
            r"object whose values are not all indices \(keys \['genes'\]\); it sits next",
        ),
        ([*NAMES[:63], 7], r"; found entry 63 is 7, not a name; it sits next to the checkpoint"),
        ("ENSG00000", r"; found a JSON str; it sits next to the checkpoint"),
        ([*NAMES[:63], NAMES[0]], r"names genes more than once: \['ENSG00000'\]"),
        ({**{n: i for i, n in enumerate(NAMES[:63])}, "X": 64}, r"out of range: \[64\]"),
    ],
)
def test_bad_genes_json_shapes_name_the_file(content: object, message: str, tmp_path: Path) -> None:
    exp = _experiment(tmp_path, content)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(exp)
    assert str(exp / "genes.json") in str(err.value)


def test_genes_json_that_is_not_json_or_repeats_a_key_names_the_file(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    (exp / "genes.json").write_text("GENE0\nGENE1\n")
    with pytest.raises(CheckpointError, match=r"genes\.json is not valid JSON \(Expecting value"):
        load_checkpoint(exp)
    keys = ", ".join(f'"{name}": {i}' for i, name in enumerate(NAMES))
    (exp / "genes.json").write_text("{" + keys + ', "ENSG00002": 2}')
    with pytest.raises(CheckpointError, match=r"gene names listed more than once: \['ENSG00002'\]"):
        load_checkpoint(exp)
