"""``sedd calibrate`` and a model's calibrated schedule: searched, stored, used by default."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from server_client import make_settings, served
from server_models import GENES, NUM_BINS, PERTURBATIONS, save_tiny_model

import sedd
from sedd.checkpoints.calibration import CALIBRATION_FILE
from sedd.checkpoints.io import CheckpointError
from sedd.cli import main
from sedd.defaults import LIBRARY_SCHEDULE
from sedd.eval.calibration import Candidate, worse_figures

pytestmark = pytest.mark.anyio


def held_out_file(path: Path, n_test: int = 12, n_train: int = 24) -> Path:
    rng = np.random.default_rng(0)
    n = n_test + n_train
    obs = pd.DataFrame(
        {"bulk_labels": [PERTURBATIONS[i % 3] for i in range(n)],
         "split": ["test"] * n_test + ["train"] * n_train},
        index=[f"c{i}" for i in range(n)],
    )  # fmt: skip
    counts = sp.csr_matrix(rng.poisson(1.0, size=(n, len(GENES))).clip(0, NUM_BINS - 1))
    anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=GENES)).write_h5ad(path)
    return path


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model calibrated by the command line, its sets cached beside it."""
    root = tmp_path_factory.mktemp("calibrate")
    model = save_tiny_model(root / "tiny")
    data = held_out_file(root / "held_out.h5ad")
    argv = ["calibrate", "--model", str(model), "--data", str(data), "--seeds", "2",
            "--candidate", "entropy:4:0", "--candidate", "euler:2", "--precision", "fp32",
            "--device", "cpu", "--work", str(root / "sets")]  # fmt: skip
    assert main(argv) == 0
    return model


def test_calibrate_writes_the_fewest_forwards_within_noise_beside_the_weights(calibrated: Path):
    found = json.loads((calibrated / CALIBRATION_FILE).read_text())
    assert found["reference"]["sampler"] == "euler" and found["reference"]["steps"] == 50
    assert [c["setting"] for c in found["candidates"]] == [
        "entropy, bound 0, cap 4", "euler, 2 uniform steps"]  # fmt: skip
    assert found["weights_sha256"] == sedd.load(calibrated, precision="fp32").loaded.file_hash
    passing = [c for c in found["candidates"] if c["within_noise"]]
    chosen = min(passing, key=lambda c: c["forwards_per_cell"], default=None)
    if chosen is None:  # nothing kept the reference's quality: the reference is the default
        assert found["schedule"]["steps"] == 50 and not found["chosen"]["within_noise_of_reference"]
    else:
        assert found["schedule"]["sampler"] == chosen["sampler"]
        assert found["schedule"]["steps"] == chosen["steps"]
    for row in found["candidates"]:  # each verdict is the test's, on the figures stored
        assert row["within_noise"] == (not worse_figures(row, found["reference"]))
    assert "sedd calibrate" in found["command"]


async def test_a_calibrated_model_samples_with_its_schedule_by_default(
    calibrated: Path, tmp_path: Path
) -> None:
    calibration = json.loads((calibrated / CALIBRATION_FILE).read_text())
    calibration["schedule"] = {"sampler": "entropy", "steps": 5, "time_grid": "uniform",
                               "entropy_bound": 2.5}  # fmt: skip
    (calibrated / CALIBRATION_FILE).write_text(json.dumps(calibration))
    model = sedd.load(calibrated, precision="fp32")
    assert model.loaded.calibrated and model.loaded.schedule.sampler == "entropy"
    cells = model.generate(3, condition=PERTURBATIONS[0], seed=4)
    record = cells.uns["sedd"]
    assert (record["sampler"], record["steps"], record["entropy_bound"]) == ("entropy", 5, 2.5)
    assert cells.uns["sedd"]["timings"]["forwards_per_cell"] <= 5
    # steps alone are st3's schedule, whatever the model carries
    assert model.generate(1, condition=PERTURBATIONS[0], steps=7).uns["sedd"]["sampler"] == "euler"
    # the CLI and the server default to it too, and give the same cells
    out = tmp_path / "cells.h5ad"
    argv = ["generate", "--model", str(calibrated), "--conditions", PERTURBATIONS[0], "--cells",
            "3", "--seed", "4", "--precision", "fp32", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    np.testing.assert_array_equal(anndata.read_h5ad(out).X.toarray(), cells.X.toarray())
    async with served(make_settings(calibrated)) as (client, _):
        card = (await client.get("/v1/models")).json()["data"][0]
        body = {"num_cells": 3, "condition": PERTURBATIONS[0], "seed": 4}
        served_cells = (await client.post("/generate", json=body)).json()["counts"]
    assert card["default_schedule"] == {"sampler": "entropy", "steps": 5, "entropy_bound": 2.5}
    assert card["schedule_calibrated"] is True
    np.testing.assert_array_equal(np.array(served_cells), cells.X.toarray())


def test_a_calibration_of_other_weights_is_ignored_and_a_broken_one_refused(tmp_path: Path):
    model = save_tiny_model(tmp_path / "tiny")
    schedule = {"sampler": "entropy", "steps": 5}
    (model / CALIBRATION_FILE).write_text(json.dumps({
        "schedule": schedule, "weights_sha256": "0" * 64, "reference": {}, "candidates": [],
    }))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = sedd.load(model, precision="fp32").loaded
    assert loaded.schedule == LIBRARY_SCHEDULE and not loaded.calibrated
    assert any("calibrated on other weights" in str(w.message) for w in caught)
    (model / CALIBRATION_FILE).write_text(json.dumps({"schedule": {"sampler": "ddpm"}}))
    with pytest.raises(CheckpointError, match=r"calibration.json: `schedule.sampler` input"):
        sedd.load(model, precision="fp32")


def test_a_candidate_spec_names_its_schedule_and_a_bad_one_is_one_line():
    assert Candidate.parse("entropy:12:80") == Candidate("entropy", 12, 80.0)
    assert Candidate.parse("euler:10").record() == {"sampler": "euler", "steps": 10}
    assert Candidate("entropy", 12, 80.0).name(3) == "entropy-12-b80-s3"
    with pytest.raises(ValueError, match=r"--candidate must be .* got 'entropy:12'"):
        Candidate.parse("entropy:12")
