"""Imputation under each cell's own condition: ``condition_key`` in the API, ``--condition-key``
in the CLI, ``cell_conditions`` over HTTP; the output keeps the input's names and obs columns."""

from __future__ import annotations

import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch
from arrays import dense
from server_client import make_settings, served
from server_models import CELL_TYPES, GENES, PERTURBATIONS, save_tiny_model

import sedd
from sedd.cli import main
from sedd.defaults import BUNDLED_DATA
from sedd.request.imputation import ImputationConditionNote

LABELS = ["CD14+ Monocyte", "CD19+ B", "CD14+ Monocyte", "Dendritic", "CD56+ NK", "CD19+ B"]


@pytest.fixture(scope="module")
def model(bundled_model: sedd.Model) -> sedd.Model:
    return bundled_model


@pytest.fixture(scope="module")
def real() -> ad.AnnData:
    """Six real cells of mixed labels, interleaved, 200 of the model's genes observed."""
    data = ad.read_h5ad(BUNDLED_DATA)
    labels = data.obs["bulk_labels"].astype(str)
    picks: list[int] = []
    for label in LABELS:
        picks.append(next(i for i in np.flatnonzero(labels == label) if i not in picks))
    return data[picks, :200].copy()


def test_each_cell_keeps_its_label_and_every_obs_column(model: sedd.Model, real: ad.AnnData):
    out = model.impute(real, condition_key="bulk_labels", steps=2, seed=3)
    assert list(out.obs["bulk_labels"].astype(str)) == LABELS
    assert list(out.obs["condition"].astype(str)) == LABELS
    assert list(out.obs_names) == list(real.obs_names)
    for column in real.obs.columns:  # n_counts, split, ... kept with their values
        np.testing.assert_array_equal(
            out.obs[column].astype(str).to_numpy(), real.obs[column].astype(str).to_numpy()
        )
    assert list(out.obs["sample_idx"]) == [0, 0, 1, 0, 0, 1]  # numbered within each label
    x = dense(out.X)
    np.testing.assert_array_equal(x[:, :200], dense(real.X))  # the observed counts kept
    # a cell imputed under its own label equals the same cell imputed alone under that label
    alone = model.impute(real[3:4], condition=LABELS[3], steps=2, seed=3)
    mixed_alone = model.impute(real[3:4], condition_key="bulk_labels", steps=2, seed=3)
    np.testing.assert_array_equal(dense(alone.X), dense(mixed_alone.X))


def test_without_a_key_the_training_key_is_used_and_said(model: sedd.Model, real: ad.AnnData):
    keyed = model.impute(real, condition_key="bulk_labels", steps=2, seed=1)
    with pytest.warns(ImputationConditionNote, match="its own 'bulk_labels' label"):
        guessed = model.impute(real, steps=2, seed=1)
    np.testing.assert_array_equal(dense(guessed.X), dense(keyed.X))
    bare = real.copy()
    del bare.obs["bulk_labels"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImputationConditionNote)
        control = model.impute(bare, steps=2, seed=1)
    assert set(control.obs["bulk_labels"].astype(str)) == {model.default_condition}


def test_bad_keys_are_one_line_errors(model: sedd.Model, real: ad.AnnData):
    with pytest.raises(ValueError, match=r"`condition_key` 'cell_type' is not a column .*bulk"):
        model.impute(real, condition_key="cell_type", steps=2)
    with pytest.raises(ValueError, match=r"pass `condition` .* or `condition_key`"):
        model.impute(real, condition="Dendritic", condition_key="bulk_labels", steps=2)
    odd = real.copy()
    odd.obs["bulk_labels"] = odd.obs["bulk_labels"].astype(str).replace("Dendritic", "Dendrtic")
    with pytest.raises(ValueError, match=r"unknown .*'Dendrtic'; did you mean 'Dendritic'"):
        model.impute(odd, condition_key="bulk_labels", steps=2)


def test_the_cli_gives_the_same_cells(model: sedd.Model, real: ad.AnnData, tmp_path: Path):
    real.write_h5ad(tmp_path / "real.h5ad")
    out = tmp_path / "imputed.h5ad"
    argv = ["impute", str(tmp_path / "real.h5ad"), "--condition-key", "bulk_labels"]
    assert main([*argv, "--steps", "2", "--seed", "3", "--precision", "fp32", "--device", "cpu",
                 "--out", str(out)]) == 0  # fmt: skip
    cli = ad.read_h5ad(out)
    api = model.impute(real, condition_key="bulk_labels", steps=2, seed=3)
    np.testing.assert_array_equal(dense(cli.X), dense(api.X))
    pd.testing.assert_frame_equal(cli.obs.astype(str), api.obs.astype(str), check_categorical=False)
    assert list(cli.var["observed"]) == list(api.var["observed"])


@pytest.mark.anyio
async def test_http_takes_a_condition_per_cell(tmp_path: Path) -> None:
    model_dir = save_tiny_model(tmp_path / "tiny")
    api_model = sedd.load(model_dir, precision="fp32", device="cpu")
    per_cell = [PERTURBATIONS[1], PERTURBATIONS[2], PERTURBATIONS[1]]
    counts = [[1, 0], [0, 2], [3, 1]]
    data = ad.AnnData(
        np.asarray(counts),
        obs=pd.DataFrame({"label": per_cell}, index=["x", "y", "z"]),
        var=pd.DataFrame(index=GENES[:2]),
    )
    api = api_model.impute(data, condition_key="label", steps=3, seed=2)
    body = {"genes": GENES[:2], "counts": counts, "cell_conditions": per_cell, "steps": 3,
            "seed": 2}  # fmt: skip
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/impute", json=body)
        bad = await client.post("/impute", json={**body, "cell_conditions": per_cell[:2]})
        unknown = await client.post(
            "/impute", json={**body, "cell_conditions": [per_cell[0], "NOPE", per_cell[2]]}
        )
    assert response.status_code == 200, response.text
    assert torch.equal(torch.tensor(response.json()["counts"]), torch.tensor(dense(api.X)))
    assert bad.status_code == 422 and "give one per cell" in bad.text
    assert unknown.status_code == 422
    [error] = unknown.json()["detail"]
    assert error["loc"] == ["body", "cell_conditions", 1]


@pytest.mark.anyio
async def test_each_cell_keeps_its_own_cell_type_in_every_door(tmp_path: Path) -> None:
    model_dir = save_tiny_model(tmp_path / "tiny")
    tiny = sedd.load(model_dir, precision="fp32", device="cpu")
    seen: list[list[int]] = []  # the cell types each forward received
    tiny.loaded.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["cell_types"].tolist()), with_kwargs=True
    )
    types = ["B", "T", "B"]
    counts = [[1, 0], [0, 2], [3, 1]]
    data = ad.AnnData(
        np.asarray(counts),
        obs=pd.DataFrame({"ct": types, "donor": ["d1", "d2", "d1"]}, index=["x", "y", "z"]),
        var=pd.DataFrame(index=GENES[:2]),
    )
    api = tiny.impute(data, condition=PERTURBATIONS[1], cell_type_key="ct", steps=3, seed=2)
    assert list(api.obs["cell_type"]) == types and list(api.obs["donor"]) == ["d1", "d2", "d1"]
    # a cell imputed among others equals that cell imputed alone under its cell type
    alone = tiny.impute(data[1:2], condition=PERTURBATIONS[1], cell_type="T", steps=3, seed=2)
    among = tiny.impute(data[1:2], condition=PERTURBATIONS[1], cell_type_key="ct", steps=3, seed=2)
    np.testing.assert_array_equal(dense(among.X), dense(alone.X))
    assert seen[0][:3] == [CELL_TYPES.index(name) for name in types]  # each row its own
    data.write_h5ad(tmp_path / "data.h5ad")
    out = tmp_path / "cli.h5ad"
    argv = ["impute", str(tmp_path / "data.h5ad"), "--model", str(model_dir), "--condition",
            PERTURBATIONS[1], "--cell-type-key", "ct", "--steps", "3", "--seed", "2",
            "--precision", "fp32", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    np.testing.assert_array_equal(dense(ad.read_h5ad(out).X), dense(api.X))
    body = {"genes": GENES[:2], "counts": counts, "condition": PERTURBATIONS[1],
            "cell_types": types, "steps": 3, "seed": 2}  # fmt: skip
    async with served(make_settings(model_dir, device="cpu")) as (client, _):
        response = await client.post("/impute", json=body)
        unknown = await client.post("/impute", json={**body, "cell_types": ["B", "Tc", "B"]})
        both = await client.post("/impute", json={**body, "cell_type": "B"})
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(np.asarray(response.json()["counts"]), dense(api.X))
    assert [cell["cell_type"] for cell in response.json()["cells"]] == types
    [error] = unknown.json()["detail"]
    assert error["loc"] == ["body", "cell_types", 1] and "did you mean 'T'" in error["msg"]
    assert both.status_code == 422 and "not both" in both.text
    with pytest.raises(ValueError, match=r"`cell_type_key` 'nope' is not a column .*ct, donor"):
        tiny.impute(data, condition=PERTURBATIONS[1], cell_type_key="nope", steps=1)


def test_a_model_without_cell_types_refuses_a_cell_type_key(
    model: sedd.Model, real: ad.AnnData
) -> None:
    with pytest.raises(ValueError, match=r"^`cell_type_key` must be left out: this model has no"):
        model.impute(real, cell_type_key="bulk_labels", steps=1)
