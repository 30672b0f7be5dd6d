"""Many models in one server (``sedd serve --models DIR``): each request reaches its model and gets
the cells that model gives alone; unknown ids are 404s; least recently used idle models unload
under the budget without failing a request in flight; a burst on one model leaves another
model's small requests served; admin load and unload."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from devices import DEVICE
from server_client import make_settings, served
from server_models import save_tiny_model

import sedd
from sedd.checkpoints import load_checkpoint, save_native

pytestmark = pytest.mark.anyio
IDS = ("alpha", "beta", "gamma")
BODY = {"condition": "KRAS", "num_cells": 2, "steps": 4, "seed": 3}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for seed, model_id in enumerate(IDS):
        save_tiny_model(root / model_id, seed=seed)
        # weights large enough that the three models' cells differ (the init is near-uniform)
        loaded = load_checkpoint(root / model_id)
        with torch.no_grad():
            for p in loaded.model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed))
        save_native(loaded, root / model_id)
    (root / "notes.txt").write_text("not a checkpoint")  # skipped, with its reason logged
    return root


def _alone(path: Path) -> np.ndarray:
    """The cells the model gives alone (the Python API, fp32), for BODY."""
    model = sedd.load(path, device=DEVICE, precision="fp32")
    cells = model.generate(2, condition="KRAS", seed=3, steps=4)
    return np.asarray(cells.X.toarray() if hasattr(cells.X, "toarray") else cells.X)


async def test_three_models_answer_each_with_the_cells_it_gives_alone(repository: Path) -> None:
    settings = make_settings(repository / "alpha", models=repository)
    async with served(settings) as (client, _):
        listed = (await client.get("/v1/models")).json()["data"]
        answers = {m: await client.post("/generate", json={**BODY, "model": m}) for m in IDS}
        default = await client.post("/generate", json=BODY)
        unknown = await client.post("/generate", json={**BODY, "model": "delta"})
        after = (await client.get("/v1/models")).json()["data"]
        one = await client.get("/v1/models/gamma")
    assert [(e["id"], e["loaded"]) for e in listed] == [
        ("alpha", True), ("beta", False), ("gamma", False)
    ]  # fmt: skip
    assert [(e["id"], e["loaded"]) for e in after] == [(m, True) for m in IDS]
    assert one.json()["checkpoint_sha256"] and one.json()["id"] == "gamma"
    cells = {}
    for model_id, answer in answers.items():
        assert answer.status_code == 200, answer.text
        assert answer.json()["metadata"]["model"] == model_id
        cells[model_id] = np.asarray(answer.json()["counts"])
        np.testing.assert_array_equal(cells[model_id], _alone(repository / model_id))
    assert not np.array_equal(cells["alpha"], cells["beta"])  # the models differ
    np.testing.assert_array_equal(np.asarray(default.json()["counts"]), cells["alpha"])
    assert unknown.status_code == 404
    assert "'alpha', 'beta', 'gamma'" in unknown.json()["detail"]


async def test_the_least_recently_used_idle_model_unloads_and_a_busy_one_never(
    repository: Path,
) -> None:
    settings = make_settings(repository / "alpha", models=repository, max_loaded_models=2)
    async with served(settings) as (client, app):
        host = app.state.host
        first = await client.post("/generate", json={**BODY, "model": "beta"})
        assert list(host.services) == ["alpha", "beta"]
        # beta is idle: gamma's load unloads it (alpha is the default and stays)
        second = await client.post("/generate", json={**BODY, "model": "gamma"})
        assert list(host.services) == ["alpha", "gamma"]
        # gamma busy with a long request: beta cannot load, and gamma's request is not failed
        slow = asyncio.create_task(
            client.post("/generate", json={**BODY, "model": "gamma", "steps": 20, "num_cells": 8})
        )
        while host.services["gamma"].engine.idle:
            await asyncio.sleep(0.005)
        refused = await client.post("/generate", json={**BODY, "model": "beta"})
        done = await slow
        again = await client.post("/generate", json={**BODY, "model": "beta"})
    assert first.status_code == second.status_code == 200
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    assert "all have work in flight" in refused.json()["detail"]
    assert done.status_code == 200 and len(done.json()["cells"]) == 8
    assert again.status_code == 200  # once gamma is idle, it unloads for beta
    np.testing.assert_array_equal(np.asarray(again.json()["counts"]), _alone(repository / "beta"))


async def test_a_burst_on_one_model_leaves_another_models_small_request_served(
    repository: Path,
) -> None:
    settings = make_settings(
        repository / "alpha", models=repository, max_rows_per_forward=4, max_cells_per_request=8
    )
    finished: list[str] = []
    async with served(settings) as (client, app):
        await client.post("/generate", json={**BODY, "model": "beta"})  # loaded beforehand

        async def ask(model_id: str, cells: int, steps: int, tag: str) -> int:
            body = {**BODY, "model": model_id, "num_cells": cells, "steps": steps}
            answer = await client.post("/generate", json=body)
            finished.append(tag)
            return answer.status_code

        burst = [asyncio.create_task(ask("alpha", 4, 12, f"burst{i}")) for i in range(12)]
        while app.state.host.services["alpha"].engine.idle:
            await asyncio.sleep(0.005)
        small = await ask("beta", 1, 3, "small")
        statuses = await asyncio.gather(*burst)
    assert small == 200 and set(statuses) <= {200, 429}
    # the small request took a tick each round beside the burst, so it ended first
    assert finished.index("small") == 0, finished


async def test_admin_load_and_unload_are_off_by_default_and_refuse_work_in_flight(
    repository: Path,
) -> None:
    async with served(make_settings(repository / "alpha", models=repository)) as (client, _):
        off = await client.post("/v1/models/beta/load")
        hidden = (await client.get("/openapi.json")).json()["paths"]
    assert off.status_code == 403 and "--model-admin" in off.json()["detail"]
    assert not [path for path in hidden if path.endswith(("/load", "/unload"))]  # not advertised
    settings = make_settings(repository / "alpha", models=repository, model_admin=True)
    async with served(settings) as (client, app):
        loaded = await client.post("/v1/models/beta/load")
        default = await client.post("/v1/models/alpha/unload")
        unknown = await client.post("/v1/models/delta/unload")
        app.state.host.users["beta"] += 1  # a request holds beta
        busy = await client.post("/v1/models/beta/unload")
        app.state.host.users["beta"] -= 1
        unloaded = await client.post("/v1/models/beta/unload")
        listed = (await client.get("/v1/models/beta")).json()
        shown = (await client.get("/openapi.json")).json()["paths"]
    assert "/v1/models/{model_id}/unload" in shown
    assert loaded.status_code == 200 and loaded.json()["loaded"] is True
    assert default.status_code == 409 and "default model" in default.json()["detail"]
    assert unknown.status_code == 404
    assert busy.status_code == 409 and "in flight" in busy.json()["detail"]
    assert unloaded.status_code == 200 and listed["loaded"] is False


def test_models_named_one_by_one_on_the_command_line(
    repository: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sedd.cli import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr("server.serve.serve", lambda app, settings: seen.update(app=app))
    argv = ["serve", "--model", f"g={repository / 'gamma'}", "--model", f"a={repository / 'alpha'}"]
    with contextlib.redirect_stdout(None):
        assert main([*argv, "--device", "cpu", "--precision", "fp32"]) == 0
    host = seen["app"].state.preloaded
    assert host.ids == ["a", "g"] and host.default_id == "g"  # the first named is the default
    assert list(host.services) == ["g"]  # loaded before anything listens
    errors = {
        "mixed": ["--model", f"a={repository / 'alpha'}", "--model", str(repository / "beta")],
        "twice": ["--model", f"a={repository / 'alpha'}", "--model", f"a={repository / 'beta'}"],
        "not a model": ["--model", f"n={repository / 'notes.txt'}"],
        "bad id": ["--model", f"a b={repository / 'alpha'}"],
    }
    for name, flags in errors.items():
        assert main(["serve", *flags, "--device", "cpu"]) == 2, name
        said = capsys.readouterr().err
        assert said.startswith("sedd serve: error:") and "--model" in said, (name, said)
        assert len(said.strip().splitlines()) == 1, said  # one line, no traceback


async def test_named_models_route_by_their_ids(repository: Path) -> None:
    named = {"one": repository / "beta", "two": repository / "gamma"}
    settings = make_settings(repository / "alpha", model_map=named)
    async with served(settings) as (client, _):
        default = await client.post("/generate", json=BODY)
        two = await client.post("/generate", json={**BODY, "model": "two"})
    assert default.json()["metadata"]["model"] == "one"
    np.testing.assert_array_equal(np.asarray(default.json()["counts"]), _alone(named["one"]))
    np.testing.assert_array_equal(np.asarray(two.json()["counts"]), _alone(named["two"]))


async def test_rays_lru_giving_a_model_up_never_unloads_one_in_use(repository: Path) -> None:
    from server.ray.replicas import HeldModel  # what Ray's multiplexer holds, and gives up

    async with served(make_settings(repository / "alpha", models=repository)) as (client, app):
        host = app.state.host
        assert (await client.post("/generate", json={**BODY, "model": "beta"})).status_code == 200
        host.users["beta"] += 1  # a request holds beta while Ray's LRU gives it up
        await HeldModel(host, "beta").__del__()
        kept = "beta" in host.services
        host.users["beta"] -= 1
        await HeldModel(host, "beta").__del__()
        await HeldModel(host, "alpha").__del__()  # the default model: never unloaded
        after = list(host.services)
    assert kept and after == ["alpha"]
