"""One default cell count per perturbation, st3's, in every front door: ``sedd predict``,
``Model.predict`` and HTTP ``/predict`` make ``sedd.defaults.CELLS_PER_PERTURBATION`` cells of
each perturbation (and of the control) when none is asked for, and each one's help says so."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from devices import DEVICE
from server_client import make_settings, served
from server_models import save_tiny_model

import sedd
from sedd.cli import build_parser
from sedd.defaults import CELLS_PER_PERTURBATION
from server.schemas import PredictRequest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("defaults") / "tiny")


def test_the_default_is_st3s_num_samples_per_pert() -> None:
    assert CELLS_PER_PERTURBATION == 10


def test_sedd_predict_help_states_the_default() -> None:
    _, commands = build_parser()
    parser = commands["predict"]
    assert parser.parse_args([]).cells_per_perturbation == CELLS_PER_PERTURBATION
    text = " ".join(parser.format_help().split())
    assert f"control included (default {CELLS_PER_PERTURBATION}, st3's;" in text


def test_model_predict_signature_and_docstring_state_the_default() -> None:
    method = sedd.Model.predict
    default = inspect.signature(method).parameters["cells_per_perturbation"].default
    assert default == CELLS_PER_PERTURBATION
    assert f"(default {CELLS_PER_PERTURBATION}, st3's" in " ".join(str(method.__doc__).split())


def test_openapi_states_the_http_default() -> None:
    field = PredictRequest.model_json_schema()["properties"]["cells_per_perturbation"]
    assert field["default"] == CELLS_PER_PERTURBATION
    assert f"(default {CELLS_PER_PERTURBATION}, st3's" in field["description"]


def test_model_predict_makes_the_default_count_of_each(model_dir: Path) -> None:
    model = sedd.load(model_dir, device=DEVICE, precision="fp32")
    cells = model.predict(["KRAS"], steps=1, progress=False)
    assert cells.obs["perturbation"].value_counts().to_dict() == {
        "ctrl": CELLS_PER_PERTURBATION,
        "KRAS": CELLS_PER_PERTURBATION,
    }


@pytest.mark.anyio
async def test_http_predict_makes_the_default_count_of_each(model_dir: Path) -> None:
    settings = make_settings(model_dir, max_cells_per_request=2 * CELLS_PER_PERTURBATION)
    async with served(settings) as (client, _):
        response = await client.post("/predict", json={"perturbations": ["KRAS"], "steps": 1})
    assert response.status_code == 200, response.text
    groups = response.json()["perturbations"]
    assert [(g["name"], len(g["counts"])) for g in groups] == [
        ("ctrl", CELLS_PER_PERTURBATION),
        ("KRAS", CELLS_PER_PERTURBATION),
    ]
