"""The HTTP service: every route, its validation errors and limits, auth, metrics, SSE, h5ad.

The app runs in-process on a tiny conditional model (12 genes, counts 0..5, 5 labels, 2 cell
types) saved in the native format; results are checked against ``sedd.run.generate``.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import anndata
import httpx
import jsonschema
import numpy as np
import pytest
import torch
from devices import DEVICE, ON_CUDA
from engine_models import request_of
from server_client import make_settings, served
from server_models import GENES, NUM_BINS, save_tiny_model

from sedd.checkpoints import load_checkpoint
from sedd.diffusion.st3_samplers import EulerSampler
from sedd.engine.monitor import MonitorSnapshot
from sedd.precision import resolve_precision
from sedd.request.plan import plan
from sedd.run import run_plan
from server.app import create_app, preload
from server.metrics import ServiceMetrics, monitor_families

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("server") / "tiny")


def solo_counts(model_dir: Path, **request: object) -> np.ndarray:
    """The same request run alone through the library (no server, no batching)."""
    loaded = load_checkpoint(model_dir, device=DEVICE)
    precision = resolve_precision("fp32", DEVICE)
    return run_plan(plan(loaded, request_of(**request)), precision).counts  # type: ignore[arg-type]


async def test_healthz_needs_no_key_and_readyz_reports_an_idle_engine(model_dir: Path) -> None:
    async with served(make_settings(model_dir, api_key="s3cret")) as (client, _):
        health = await client.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = await client.get("/readyz", headers={"Authorization": "Bearer s3cret"})
        assert ready.status_code == 200
        assert ready.json() == {
            "status": "ready",
            "queued_jobs": 0,
            "active_jobs": 0,
            "active_rows": 0,
            "seconds_since_step": None,
        }


async def test_readyz_reports_a_never_stepped_engine_after_a_warm_up_that_failed(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm-up job that fails is handed back inside its tick, which then writes its end: the
    warm-up waits for that end before it forgets its ticks (here the tick ends 0.3 s after)."""
    from sedd.engine.core import Engine

    timed = Engine._time

    def slow_time(engine: Engine, seconds: float, calls: int) -> None:
        time.sleep(0.3)  # the engine thread, slow between the hand-off and the tick's end
        timed(engine, seconds, calls)

    def failing(module: torch.nn.Module, args: object) -> None:
        raise RuntimeError("this forward fails")

    monkeypatch.setattr(Engine, "_time", slow_time)
    app = create_app(make_settings(model_dir))
    preload(app).loaded.model.register_forward_pre_hook(failing)
    async with app.router.lifespan_context(app):
        await asyncio.sleep(0.5)  # past the failing tick's end
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sedd.test") as client:
            ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["seconds_since_step"] is None


async def test_readyz_tells_an_idle_engine_from_a_stalled_one(model_dir: Path) -> None:
    async with served(make_settings(model_dir), slow_s=1.0) as (client, app):
        engine = app.state.service.engine
        work = asyncio.ensure_future(client.post("/generate", json={"steps": 3}))
        while engine.tick_started_monotonic is None:  # the first tick after a long idle
            await asyncio.sleep(0.01)
        engine.last_tick_monotonic = time.monotonic() - 100  # idle for 100 s before it
        after_idle = await client.get("/readyz")
        engine.tick_started_monotonic = time.monotonic() - 100  # no tick began for 100 s
        stalled = await client.get("/readyz")
        await work
    assert after_idle.status_code == 200 and after_idle.json()["active_jobs"] == 1
    assert stalled.status_code == 503
    assert stalled.json()["detail"].startswith("not ready: the engine has work but has not")


async def test_api_key_is_required_on_every_route_but_healthz(model_dir: Path) -> None:
    async with served(make_settings(model_dir, api_key="s3cret")) as (client, _):
        body = {"num_cells": 1, "steps": 2}
        for method, url in (
            ("GET", "/readyz"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
            ("POST", "/generate"),
        ):
            missing = await client.request(method, url, json=body if method == "POST" else None)
            assert missing.status_code == 401, url
            assert missing.headers["www-authenticate"] == "Bearer"
            assert missing.json() == {
                "detail": "missing bearer API key: send `Authorization: Bearer <key>`."
            }
        wrong = await client.post("/generate", json=body, headers={"Authorization": "Bearer no"})
        assert (wrong.status_code, wrong.json()) == (401, {"detail": "invalid API key."})
        right = await client.post(
            "/generate", json=body, headers={"Authorization": "Bearer s3cret"}
        )
        assert right.status_code == 200


async def test_generate_equals_a_solo_library_run_and_reports_metadata(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        body = {"num_cells": 3, "steps": 6, "condition": "KRAS", "cell_type": "B", "seed": 7}
        response = await client.post("/generate", json=body)
    assert response.status_code == 200
    data = response.json()
    expected = solo_counts(
        model_dir, cells_per_condition=3, conditions=("KRAS",), cell_type="B", steps=6, seed=7
    )
    assert data["genes"] == GENES
    np.testing.assert_array_equal(np.array(data["counts"]), expected)
    names = [cell.pop("name") for cell in data["cells"]]
    assert data["cells"] == [
        {
            "condition": "KRAS",
            "perturbation": "KRAS",
            "sample_idx": i,
            "cell_type": "B",
            "seed": 7,
            "cell_index": i,
        }
        for i in range(3)
    ]
    run_id = names[0].rsplit("-", 1)[0]
    assert names == [f"{run_id}-{i}" for i in range(3)] and run_id
    meta = data["metadata"]
    assert {k: meta[k] for k in ("seed", "steps", "sampler", "temperature", "forwards")} == {
        "seed": 7,
        "steps": 6,
        "sampler": "euler",
        "temperature": 1.0,
        "forwards": 6,  # 6 steps; the denoise found no mask left, so ran no forward
    }
    assert meta["precision"]["amp_dtype"] == "fp32" and meta["precision"]["fp32_fallbacks"] == 0
    assert meta["queue_seconds"] >= 0 and meta["compute_seconds"] > 0
    assert len(meta["checkpoint_sha256"]) == 64 and meta["scale"] == "counts"
    # what a cell cost: 3 cells in one block a step, up to 6 steps each, all 12 genes drawn
    assert 1 <= meta["forwards_per_cell"] <= 6 and meta["entropy_bound"] is None
    assert meta["genes_per_forward"] == pytest.approx(12 / meta["forwards_per_cell"])


async def test_generate_without_condition_uses_the_control_label(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/generate", json={"num_cells": 2, "steps": 3})
    assert [c["perturbation"] for c in response.json()["cells"]] == ["ctrl", "ctrl"]
    expected = solo_counts(model_dir, cells_per_condition=2, conditions=("ctrl",), steps=3)
    np.testing.assert_array_equal(np.array(response.json()["counts"]), expected)


async def test_predict_returns_cells_means_and_shift_versus_control(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        body = {"perturbations": ["KRAS", "TP53"], "cells_per_perturbation": 2, "steps": 4}
        response = await client.post("/predict", json=body)
    assert response.status_code == 200
    data = response.json()
    expected = solo_counts(
        model_dir, cells_per_condition=2, conditions=("ctrl", "KRAS", "TP53"), steps=4
    )
    groups = data["perturbations"]
    assert [(g["name"], g["is_control"]) for g in groups] == [  # control first, as `sedd predict`
        ("ctrl", True),
        ("KRAS", False),
        ("TP53", False),
    ]
    assert data["control"] == "ctrl"
    got = np.concatenate([np.array(g["counts"]) for g in groups])
    np.testing.assert_array_equal(got, expected)
    control_mean = expected[:2].mean(axis=0)
    for i, group in enumerate(groups):
        mean = expected[2 * i : 2 * i + 2].mean(axis=0)
        np.testing.assert_allclose(group["mean"], mean)
        np.testing.assert_allclose(group["shift_vs_control"], mean - control_mean)


async def test_predict_unknown_perturbation_is_422_naming_it_with_suggestions(
    model_dir: Path,
) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/predict", json={"perturbations": ["KRAS", "tp5"]})
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "type": "unknown_perturbation",
                "loc": ["body", "perturbations", 1],
                "msg": "unknown perturbation 'tp5'; did you mean 'TP53'? The model knows 5: "
                "'ctrl', 'KRAS', 'TP53', 'MYC', 'BAD'.",
                "input": "tp5",
                "ctx": {"suggestions": ["TP53"]},
            }
        ]
    }


async def test_impute_keeps_given_counts_and_matches_a_solo_sampler_run(model_dir: Path) -> None:
    counts = [[1, 5], [0, 2]]
    async with served(make_settings(model_dir)) as (client, _):
        body = {"genes": ["GENE3", "GENE0"], "counts": counts, "steps": 5, "seed": 3}
        response = await client.post("/impute", json=body)
    assert response.status_code == 200
    data = response.json()
    got = np.array(data["counts"])
    np.testing.assert_array_equal(got[:, [3, 0]], np.array(counts))
    assert data["observed_genes"] == ["GENE3", "GENE0"]
    loaded = load_checkpoint(model_dir, device=DEVICE)
    x_init = torch.full((2, len(GENES)), NUM_BINS, dtype=torch.long)
    x_init[:, [3, 0]] = torch.tensor(counts)
    fixed = x_init != NUM_BINS
    precision = resolve_precision("fp32", DEVICE)
    sampler = EulerSampler(loaded.model, loaded.noise, loaded.graph, precision=precision)
    solo = sampler.sample(steps=5, seed=3, x_init=x_init, fixed=fixed, labels=torch.tensor([0, 0]))
    np.testing.assert_array_equal(got, solo.cpu().numpy())


async def test_impute_drops_unknown_genes_and_clips_on_request(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        body = {"counts": [[1, 4]], "steps": 3, "seed": 2}
        with_extra = await client.post("/impute", json={**body, "genes": ["GENE1", "GENE99"]})
        alone = await client.post("/impute", json={**body, "counts": [[1]], "genes": ["GENE1"]})
        none_known = await client.post("/impute", json={"genes": ["X1", "X2"], "counts": [[1, 1]]})
        too_big = {"genes": ["GENE1"], "counts": [[2], [6]], "steps": 3}
        refused = await client.post("/impute", json=too_big)
        clipped = await client.post("/impute", json={**too_big, "clip": True})
    assert with_extra.status_code == alone.status_code == 200
    extra, solo = with_extra.json(), alone.json()
    assert extra["dropped_genes"] == ["GENE99"] and solo["dropped_genes"] == []
    assert extra["observed_genes"] == ["GENE1"]
    assert extra["counts"] == solo["counts"]  # the unknown gene changes nothing
    assert none_known.status_code == 422
    [error] = none_known.json()["detail"]
    assert (error["type"], error["loc"]) == ("unknown_gene", ["body", "genes"])
    assert error["msg"].startswith("none of the 2 genes is one of the model's 12 genes")
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert (error["type"], error["loc"], error["ctx"]) == (
        "count_out_of_range",
        ["body", "counts"],
        {"max_count": 5},
    )
    assert error["msg"].startswith(
        "1 count value(s) are out of range for this model (max count 6, first at cell 1, "
        "gene 'GENE1')"
    )
    assert 'HTTP: "clip": true' in error["msg"]
    assert clipped.status_code == 200
    assert [row[1] for row in clipped.json()["counts"]] == [2, 5]  # 6 clipped to the top count


@pytest.mark.parametrize(
    ("url", "body", "loc", "msg"),
    [
        (
            "/generate",
            {"num_cells": 0},
            ["body", "num_cells"],
            "Input should be greater than or equal to 1",
        ),
        (
            "/generate",
            {"num_cells": 9},
            ["body", "num_cells"],
            "the request asks for 9 cells; the limit is 8 (max_cells_per_request)",
        ),
        (
            "/generate",
            {"steps": 21},
            ["body", "steps"],
            "Input should be less than or equal to 20 (max_steps)",
        ),
        (
            "/generate",
            {"temperature": 0},
            ["body", "temperature"],
            "Input should be greater than or equal to 0.05",
        ),
        (
            "/generate",
            {"sampler": "ddpm"},
            ["body", "sampler"],
            "Input should be 'euler', 'analytic' or 'entropy'",
        ),
        (
            "/generate",
            {"condition": "KRAS", "extra": 1},
            ["body", "extra"],
            "unknown field 'extra' (fields: steps, time_grid, sampler, entropy_bound, temperature, "
            "seed, format, timeout_s, model, num_cells, condition, conditions, cell_type)",
        ),
        (
            "/predict",
            {"perturbations": ["KRAS", "TP53"], "cells_per_perturbation": 3},
            ["body", "cells_per_perturbation"],
            "the request asks for 9 cells; the limit is 8 (max_cells_per_request)",
        ),
        (
            "/generate",
            {"cell_type": "NK"},
            ["body", "cell_type"],
            "unknown cell type 'NK' The model knows 2: 'T', 'B'.",
        ),
    ],
)
async def test_field_bounds_are_422_naming_the_field(
    model_dir: Path, url: str, body: dict, loc: list, msg: str
) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post(url, json=body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert (error["loc"], error["msg"]) == (loc, msg)


async def test_body_over_max_body_bytes_is_413_declared_or_streamed(model_dir: Path) -> None:
    big = json.dumps({"genes": GENES, "counts": [[1] * 12] * 400}).encode()
    detail = "request body exceeds max_body_bytes=4096 bytes"

    async def chunks():  # no Content-Length: the size is only known while streaming
        for lo in range(0, len(big), 1000):
            yield big[lo : lo + 1000]

    async with served(make_settings(model_dir)) as (client, _):
        declared = await client.post("/impute", content=big)
        streamed = await client.post("/impute", content=chunks())
    assert declared.status_code == 413
    assert declared.json() == {
        "detail": f"{detail} (got at least {len(big)} bytes); send fewer cells or genes."
    }
    assert streamed.status_code == 413
    assert streamed.json()["detail"].startswith(detail)


async def test_h5ad_by_format_field_or_accept_header(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        body = {"num_cells": 2, "steps": 3, "condition": "MYC"}
        as_json = (await client.post("/generate", json=body)).json()
        by_field = await client.post("/generate", json={**body, "format": "h5ad"})
        by_header = await client.post(
            "/predict",
            json={"perturbations": ["MYC"], "cells_per_perturbation": 1, "steps": 3},
            headers={"Accept": "application/x-hdf5"},
        )
    assert by_field.headers["content-type"] == "application/x-hdf5"
    adata = anndata.read_h5ad(io.BytesIO(by_field.content))
    np.testing.assert_array_equal(
        np.asarray(adata.X.todense() if hasattr(adata.X, "todense") else adata.X), as_json["counts"]
    )
    assert list(adata.var_names) == GENES
    assert list(adata.obs["perturbation"]) == ["MYC", "MYC"]
    assert adata.uns["sedd"]["steps"] == 3 and adata.uns["sedd"]["precision"]["amp_dtype"] == "fp32"
    predicted = anndata.read_h5ad(io.BytesIO(by_header.content))
    assert list(predicted.obs["perturbation"]) == ["ctrl", "MYC"]


async def test_stream_sends_queued_progress_per_step_then_the_result(model_dir: Path) -> None:
    body = {"num_cells": 2, "steps": 3, "condition": "TP53"}
    async with served(make_settings(model_dir)) as (client, _):
        plain = (await client.post("/generate", json=body)).json()
        openapi = (await client.get("/openapi.json")).json()
        async with client.stream("POST", "/generate/stream", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            text = "".join([chunk async for chunk in response.aiter_text()])
    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("\n")[1][6:]))
        for block in text.strip().split("\n\n")
    ]
    names = [name for name, _ in events]
    assert names[0] == "queued" and names[-1] == "result"
    progress = [data for name, data in events if name == "progress"]
    steps = [data["step"] for data in progress]
    # a step at a time; a cell leaves once its genes are all drawn (3 steps to t = 1e-5 leave
    # none for the denoise), and the job's last event says it is done: step == steps
    assert steps == sorted(set(steps)) and steps[:2] == [1, 2] and steps[-1] == 4
    assert all(data["steps"] == 4 for data in progress)
    assert sum(data["cells_finished"] for data in progress) == 2
    unmasked = [data["fraction_unmasked"] for data in progress]
    assert unmasked == sorted(unmasked) and unmasked[-1] == 1.0
    assert events[-1][1]["counts"] == plain["counts"]
    # every event is one of the schema's typed events (OpenAPI 3.2 itemSchema)
    for name, data in events:
        jsonschema.validate(data, _event_schema(openapi, "/generate/stream", name))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"step": "1"}, _event_schema(openapi, "/generate/stream", "progress"))


def _event_schema(openapi: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    """The JSON schema of the ``data`` of event ``name`` on ``path``, its refs resolvable."""
    content = openapi["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    [event] = [
        e for e in content["itemSchema"]["oneOf"] if e["properties"]["event"]["const"] == name
    ]
    return {**event["properties"]["data"]["contentSchema"], "components": openapi["components"]}


async def test_stream_reports_an_unknown_name_before_streaming(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/predict/stream", json={"perturbations": ["KRAZ"]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["ctx"] == {"suggestions": ["KRAS"]}


async def test_model_card_lists_genes_labels_control_precision_and_hash(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        card = (await client.get("/v1/models")).json()["data"][0]
    assert (card["id"], card["num_genes"], card["max_count"]) == ("tiny", 12, 5)
    assert card["perturbations"] == ["ctrl", "KRAS", "TP53", "MYC", "BAD"]
    assert (card["control_label"], card["cell_types"]) == ("ctrl", ["T", "B"])
    assert card["precision"]["amp_dtype"] == "fp32"
    assert card["checkpoint_sha256"] == load_checkpoint(model_dir).file_hash
    assert card["limits"]["max_cells_per_request"] == 8


async def test_metrics_count_requests_by_route_and_outcome(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        ok = await client.post("/generate", json={"num_cells": 2, "steps": 3})
        await client.post("/generate", json={"num_cells": 0})
        text = (await client.get("/metrics")).text
    forwards = ok.json()["metadata"]["forwards"]  # one block of 2 rows per forward here
    assert forwards in (3, 4)  # 3 steps, and the denoise only if a mask was left
    for line in (
        # every request and engine series names the model that served it ("": none did)
        'sedd_requests_total{model="tiny",outcome="ok",route="/generate"} 1.0',
        'sedd_requests_total{model="",outcome="rejected",route="/generate"} 1.0',
        'sedd_queue_seconds_count{model="tiny",route="/generate"} 1.0',
        'sedd_request_seconds_count{model="tiny",route="/generate"} 1.0',
        'sedd_request_seconds_count{model="",route="/generate"} 1.0',
        'sedd_jobs_total{model="tiny",outcome="ok"} 1.0',
        'sedd_cells_generated_total{model="tiny"} 2.0',
        'sedd_tokens_generated_total{model="tiny"} 24.0',
        f'sedd_forwards_total{{model="tiny"}} {forwards:.1f}',
        f'sedd_rows_per_forward_count{{model="tiny"}} {forwards:.1f}',
        f'sedd_rows_per_forward_sum{{model="tiny"}} {2 * forwards:.1f}',
        f'sedd_step_seconds_count{{model="tiny"}} {forwards:.1f}',
        'sedd_fp32_fallbacks_total{model="tiny"} 0.0',
        "sedd_cells_per_second 0.0333",  # 2 cells over the one-minute window
        "sedd_tokens_per_second 0.4",  # 2 x 12 tokens / 60 s
        'sedd_engine{model="tiny",quantity="active_rows"} 0.0',
    ):
        assert line in text, line
    samples = _samples(text)
    assert samples["sedd_forwards_per_second"] == pytest.approx(forwards / 60)  # one-minute window
    rss = samples['sedd_memory_bytes{kind="process_rss"}']
    peak = samples['sedd_memory_bytes{kind="process_rss_peak"}']
    assert 50 * 2**20 < rss <= peak + 16 * 2**20  # torch alone is > 50 MiB
    cuda = any(name.startswith('sedd_memory_bytes{kind="cuda') for name in samples)
    assert cuda == ON_CUDA  # CUDA memory gauges exactly where the model is on a GPU


def _samples(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}, comments skipped."""
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def test_gpu_snapshot_becomes_cuda_memory_and_utilisation_gauges() -> None:
    mib = 2**20
    snap = MonitorSnapshot(
        seconds=120.0,
        cells=30,
        tokens=360,
        forwards=90,
        rows=400,
        cells_per_s=0.5,
        tokens_per_s=6.0,
        forwards_per_s=1.5,
        memory_kind="cuda_allocated",
        memory_current_mib=100.0,
        memory_peak_mib=250.0,
        process_rss_mib=900.0,
        process_peak_rss_mib=1000.0,
        gpu_utilization_pct=87.0,
        gpu_memory_used_mib=4096.0,
        gpu_memory_total_mib=81920.0,
        rate_window_s=60.0,
    )
    samples = {
        (family.name, tuple(sample.labels.values())): sample.value
        for family in monitor_families(snap)
        for sample in family.samples
    }
    assert samples == {
        ("sedd_cells_per_second", ()): 0.5,
        ("sedd_tokens_per_second", ()): 6.0,
        ("sedd_forwards_per_second", ()): 1.5,
        ("sedd_memory_bytes", ("process_rss",)): 900 * mib,
        ("sedd_memory_bytes", ("process_rss_peak",)): 1000 * mib,
        ("sedd_memory_bytes", ("cuda_allocated",)): 100 * mib,
        ("sedd_memory_bytes", ("cuda_allocated_peak",)): 250 * mib,
        ("sedd_gpu_utilization_ratio", ()): 0.87,
        ("sedd_gpu_memory_bytes", ("used",)): 4096 * mib,
        ("sedd_gpu_memory_bytes", ("total",)): 81920 * mib,
    }
    assert b"sedd_cells_per_second" not in ServiceMetrics().render()  # no monitor yet: no gauges


async def test_openapi_carries_the_server_limits_and_examples(model_dir: Path) -> None:
    async with served(make_settings(model_dir)) as (client, _):
        schema = (await client.get("/openapi.json")).json()
    generate_schema = schema["components"]["schemas"]["GenerateRequest"]
    assert generate_schema["properties"]["num_cells"]["maximum"] == 8
    steps = generate_schema["properties"]["steps"]["anyOf"]  # an integer, or null: the default
    assert steps[0]["maximum"] == 20 and steps[1] == {"type": "null"}
    assert generate_schema["properties"]["time_grid"]["anyOf"][0]["enum"] == ["uniform", "cosine"]
    assert generate_schema["examples"][0]["num_cells"] == 2
    impute = schema["components"]["schemas"]["ImputeRequest"]["properties"]
    assert impute["counts"]["maxItems"] == 8 and impute["counts"]["items"]["items"]["maximum"] == 5
    assert impute["genes"]["uniqueItems"] and "enum" not in impute["genes"]["items"]
    predict = schema["components"]["schemas"]["PredictRequest"]["properties"]
    assert predict["perturbations"]["items"]["enum"] == ["ctrl", "KRAS", "TP53", "MYC", "BAD"]
    assert {"/generate", "/generate/stream", "/predict", "/predict/stream", "/impute"} <= set(
        schema["paths"]
    )
