"""HTTP matches the other front doors: a label mix, the same h5ad provenance as the CLI, an
OpenAI-style ``model`` field, did-you-mean for mistyped fields, and padlocks only with a key."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import anndata
import numpy as np
import pandas as pd
import pytest
from arrays import dense
from server_client import make_settings, served

import sedd
from sedd.cli import main as sedd_main
from sedd.defaults import DEFAULT_MODEL

pytestmark = pytest.mark.anyio
SETTINGS = {"device": "cpu"}  # the bundled_model fixture's device, so cells compare bit for bit


async def test_a_label_mix_body_gives_the_cells_of_generate_like(
    bundled_model: sedd.Model,
) -> None:
    labels = ["CD56+ NK", "CD19+ B", "CD56+ NK"]  # cells of a dataset whose mix to copy
    like = anndata.AnnData(obs=pd.DataFrame({"bulk_labels": labels}, index=["a", "b", "c"]))
    api = bundled_model.generate(like=like, steps=2, seed=3)
    body = {"conditions": {"CD56+ NK": 2, "CD19+ B": 1}, "steps": 2, "seed": 3}
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        mixed = await client.post("/generate", json={**body, "format": "h5ad"})
        unknown = await client.post("/generate", json={"conditions": {"CD19 B": 1}, "steps": 1})
        both = await client.post("/generate", json={"conditions": {"CD19+ B": 1}, "num_cells": 2})
        too_many = await client.post("/generate", json={"conditions": {"CD19+ B": 9}})
    assert mixed.status_code == 200
    served_cells = anndata.read_h5ad(io.BytesIO(mixed.content))
    assert list(served_cells.obs["bulk_labels"]) == ["CD19+ B", "CD56+ NK", "CD56+ NK"]
    assert list(api.obs["bulk_labels"]) == list(served_cells.obs["bulk_labels"])
    np.testing.assert_array_equal(dense(served_cells.X), dense(api.X))
    [error] = unknown.json()["detail"]
    assert unknown.status_code == 422 and error["loc"] == ["body", "conditions", "CD19 B"]
    assert "did you mean 'CD19+ B'" in error["msg"]
    assert both.status_code == 422 and "not both" in both.text
    [limit] = too_many.json()["detail"]  # 9 cells over max_cells_per_request=8
    assert too_many.status_code == 422 and limit["loc"] == ["body", "conditions"]


async def test_the_servers_h5ad_carries_the_clis_provenance(tmp_path: Path) -> None:
    out = tmp_path / "cli.h5ad"
    argv = ["--model", str(DEFAULT_MODEL), "--conditions", "CD19+ B", "--cells", "2"]
    argv += ["--steps", "2", "--seed", "3", "--precision", "fp32", "--device", "cpu"]
    assert sedd_main(["generate", *argv, "--out", str(out)]) == 0
    body = {"condition": "CD19+ B", "num_cells": 2, "steps": 2, "seed": 3, "format": "h5ad"}
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        response = await client.post("/generate", json=body)
    cli, server = anndata.read_h5ad(out), anndata.read_h5ad(io.BytesIO(response.content))
    np.testing.assert_array_equal(dense(server.X), dense(cli.X))
    pd.testing.assert_frame_equal(server.obs, cli.obs)
    pd.testing.assert_frame_equal(server.var, cli.var)
    per_run = ("created_utc", "timings")  # when it ran and how long it took
    ours, theirs = dict(server.uns["sedd"]), dict(cli.uns["sedd"])
    assert ours.pop("route") == "/generate"  # the extras: which door and which model served it
    assert ours.pop("model_id") == DEFAULT_MODEL.name
    for key in per_run:
        assert key in ours and key in theirs
        del ours[key], theirs[key]
    assert set(ours) == set(theirs) and len(ours) > 10
    for key in ours:
        assert plain(ours[key]) == plain(theirs[key]), key


def plain(value: Any) -> Any:
    """An uns value with arrays as lists, so nested records compare with ``==``."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value.tolist() if isinstance(value, np.ndarray) else value


async def test_the_model_field_is_optional_and_must_name_the_served_model() -> None:
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        served_id = (await client.get("/v1/models")).json()["data"][0]["id"]
        named = await client.post("/generate", json={"model": served_id, "steps": 1})
        other = await client.post("/generate", json={"model": "gpt-4", "steps": 1})
        predict = await client.post(
            "/predict", json={"model": "gpt-4", "perturbations": ["CD19+ B"], "steps": 1}
        )
    assert named.status_code == 200 and len(named.json()["cells"]) == 1
    assert other.status_code == 404 == predict.status_code
    assert other.json()["detail"].startswith("no served model is called 'gpt-4'")
    assert f"this server serves {served_id!r}" in other.json()["detail"]


async def test_a_mistyped_field_gets_the_closest_names() -> None:
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        typo = await client.post("/generate", json={"conditon": "CD19+ B", "steps": 1})
        nonsense = await client.post("/predict", json={"perturbations": ["x"], "zzzz": 1})
    [error] = typo.json()["detail"]
    assert typo.status_code == 422 and error["type"] == "extra_forbidden"
    assert error["loc"] == ["body", "conditon"] and error["ctx"]["suggestions"][0] == "condition"
    assert error["msg"].startswith("unknown field 'conditon'; did you mean 'condition'")
    extra = next(e for e in nonsense.json()["detail"] if e["type"] == "extra_forbidden")
    assert extra["ctx"]["suggestions"] == [] and "fields: steps" in extra["msg"]


@pytest.mark.parametrize("key", [None, "k" * 32])
async def test_the_docs_show_padlocks_only_when_a_key_is_required(key: str | None) -> None:
    async with served(make_settings(DEFAULT_MODEL, api_key=key, **SETTINGS)) as (client, _):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        schema = (await client.get("/openapi.json", headers=headers)).json()
    operations = {
        (path, method): op for path, ops in schema["paths"].items() for method, op in ops.items()
    }
    secured = {where for where, op in operations.items() if "security" in op}
    with_401 = {where for where, op in operations.items() if "401" in op["responses"]}
    if key is None:
        assert not secured and not with_401
        assert "securitySchemes" not in schema.get("components", {})
    else:
        assert ("/generate", "post") in secured and ("/v1/models", "get") in secured
        assert ("/readyz", "get") in secured and ("/metrics", "get") in secured
        assert ("/healthz", "get") not in secured
        assert secured == with_401


@pytest.mark.parametrize(
    ("accept", "body_format", "h5ad"),
    [
        ("application/x-hdf5", None, True),
        ("application/json, application/x-hdf5;q=0", None, False),
        ("application/json;q=0.5, application/x-hdf5;q=0.9", None, True),
        ("application/json, application/x-hdf5;q=0.5", None, False),
        ("*/*", None, False),
        ("application/x-hdf5", "json", False),  # the body's own field wins
        ("application/json", "h5ad", True),
    ],
)
async def test_accept_q_values_choose_the_format(
    accept: str, body_format: str | None, h5ad: bool
) -> None:
    body: dict[str, Any] = {"steps": 1}
    if body_format is not None:
        body["format"] = body_format
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        response = await client.post("/generate", json=body, headers={"Accept": accept})
    assert response.status_code == 200
    kind = response.headers["content-type"]
    assert kind == ("application/x-hdf5" if h5ad else "application/json"), (accept, kind)


async def test_the_schema_takes_no_cell_type_for_a_model_without_cell_types() -> None:
    async with served(make_settings(DEFAULT_MODEL, **SETTINGS)) as (client, _):
        schema = (await client.get("/openapi.json")).json()
        refused = await client.post("/generate", json={"cell_type": "T", "steps": 1})
    bodies = schema["components"]["schemas"]
    for body, field in (("GenerateRequest", "cell_type"), ("ImputeRequest", "cell_types")):
        assert bodies[body]["properties"][field]["type"] == "null", (body, field)
    assert refused.status_code == 422  # what the schema says, the server does
