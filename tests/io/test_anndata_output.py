"""Generated AnnData drops into scanpy: the label under the model's training key, the cell's seed
and stream in obs, names unique across runs, CSR int32 counts and real nulls in uns."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from pydantic import ValidationError

import sedd
from sedd.checkpoints.labels import PositionalGenesWarning
from sedd.checkpoints.schema import ModelConfig
from sedd.cli import main
from sedd.defaults import DEFAULT_MODEL

ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"


@pytest.fixture(scope="module")
def pbmc(bundled_model: sedd.Model) -> sedd.Model:
    return bundled_model


def test_bundled_model_cells_carry_bulk_labels_seed_and_stream(
    pbmc: sedd.Model, tmp_path: Path
) -> None:
    cells = pbmc.generate(2, condition=["CD19+ B", "CD56+ NK"], steps=2, seed=4)
    cells.write_h5ad(tmp_path / "cells.h5ad")
    back = ad.read_h5ad(tmp_path / "cells.h5ad")
    for adata in (cells, back):
        labels = ["CD19+ B", "CD19+ B", "CD56+ NK", "CD56+ NK"]
        assert list(adata.obs["bulk_labels"]) == labels == list(adata.obs["condition"])
        assert "perturbation" not in adata.obs  # cell types are not perturbations
        assert list(adata.obs["seed"]) == [4] * 4
        assert list(adata.obs["cell_index"]) == [0, 1, 2, 3]
        assert list(adata.obs["sample_idx"]) == [0, 1, 0, 1]
        assert list(adata.obs["condition_idx"]) == [1, 1, 6, 6]
        assert isinstance(adata.X, sp.csr_matrix) and adata.X.dtype == np.int32
    assert back.uns["sedd"]["label_key"] == "bulk_labels"
    # uns holds real nulls: the request's cell_type was not given
    assert back.uns["sedd"]["request"]["cell_type"] is None
    assert "tokens_per_forward" not in back.uns["sedd"]["request"]  # the engine's: below
    engine = back.uns["sedd"]["engine"]  # what the engine ran: 1024 tokens a forward on a CPU
    assert engine["tokens_per_forward"] == engine["block_rows"] * back.n_vars
    assert "None" not in list(_strings(back.uns))


def _strings(value: object) -> list[str]:
    """Every string stored in a (nested) uns value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple | np.ndarray):
        return [s for v in value for s in _strings(v)]
    return []


def test_two_runs_with_different_seeds_concatenate_with_unique_names(pbmc: sedd.Model) -> None:
    first = pbmc.generate(3, condition="Dendritic", steps=2, seed=0)
    second = pbmc.generate(3, condition="Dendritic", steps=2, seed=1)
    assert [name.rsplit("-", 1)[1] for name in first.obs_names] == ["0", "1", "2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anndata warns on duplicate obs_names
        both = ad.concat([first, second])
    assert both.obs_names.is_unique and both.n_obs == 6
    assert list(both.obs["seed"]) == [0, 0, 0, 1, 1, 1]
    # the same request names its cells alike, whatever the batch size
    again = pbmc.generate(3, condition="Dendritic", steps=2, seed=0, batch_size=1)
    assert list(again.obs_names) == list(first.obs_names)
    pd.testing.assert_frame_equal(again.obs, first.obs)


def test_cli_file_has_the_api_obs_and_csr_counts(pbmc: sedd.Model, tmp_path: Path) -> None:
    out = tmp_path / "g.h5ad"
    argv = ["generate", "--conditions", "CD14+ Monocyte", "--cells", "2", "--steps", "2",
            "--seed", "3", "--precision", "fp32", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    from_cli = ad.read_h5ad(out)
    api = pbmc.generate(2, condition="CD14+ Monocyte", steps=2, seed=3)
    assert isinstance(from_cli.X, sp.csr_matrix) and from_cli.X.dtype == np.int32
    np.testing.assert_array_equal(from_cli.X.toarray(), api.X.toarray())
    pd.testing.assert_frame_equal(from_cli.obs, api.obs)
    assert from_cli.uns["sedd"]["request"]["cell_type"] is None


def test_label_key_must_not_take_a_column_generated_cells_already_have() -> None:
    config = ModelConfig.model_validate_json((DEFAULT_MODEL / "config.json").read_text())
    assert (config.label_key, config.label_kind) == ("bulk_labels", "cell_type")
    assert config.label_columns == ["condition", "bulk_labels"]
    data = config.model_dump()
    with pytest.raises(ValidationError, match=r"`label_key` must be .* got 'seed'"):
        ModelConfig.model_validate(data | {"label_key": "seed"})
    perturbation = ModelConfig.model_validate(data | {"label_kind": "perturbation"})
    assert perturbation.label_columns == ["condition", "bulk_labels", "perturbation"]


def test_positional_genes_warn_loudly_once_at_the_users_line_and_are_recorded() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = sedd.load(ST3 / "tiny_mlm", device="cpu", precision="fp32")
        cells = model.generate(1, steps=1, seed=0)
    [warning] = caught  # one warning, from the load; none from generate
    assert warning.category is PositionalGenesWarning and warning.filename == __file__
    assert re.search(r"GENES ARE POSITIONAL.*'0'..'63'.*GENES_FILE", str(warning.message))
    assert list(cells.var_names[:2]) == ["0", "1"]
    assert cells.uns["sedd"]["genes_by_position"] is True
    assert list(cells.obs.columns) == ["sample_idx", "seed", "cell_index"]  # unconditional


def test_st3_perturbation_model_keeps_its_training_key(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sedd.load(ST3 / "tiny_pert", device="cpu", precision="fp32")
        cells = model.generate(1, condition=model.conditions[1], steps=1, seed=0)
    assert model.loaded.config.label_key == "gene"  # st3's --gene column
    name = model.conditions[1]
    for column in ("condition", "gene", "perturbation"):
        assert list(cells.obs[column]) == [name]
