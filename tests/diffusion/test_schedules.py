"""Time grids and the default schedule: one grid function, the same schedule on every path."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import anndata
import numpy as np
import pytest
import torch
from engine_models import request_of
from server_client import make_settings, served
from server_models import save_tiny_model

import sedd
from sedd.cli import main as sedd_main
from sedd.defaults import (
    DEFAULT_ENTROPY_BOUND,
    DEFAULT_GRID,
    DEFAULT_STEPS,
    SamplingOptions,
    Schedule,
    resolve_schedule,
)
from sedd.diffusion.sampling import time_grid
from sedd.models.st3 import _ST3Base

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("grids") / "tiny")


def test_uniform_and_cosine_grids_run_from_one_to_eps() -> None:
    eps = 1e-3
    uniform = time_grid(4, eps)
    assert uniform.dtype == torch.float64
    assert uniform.tolist() == pytest.approx([1.0, 0.75025, 0.5005, 0.25075, 0.001])
    cosine = time_grid(4, eps, "cosine")
    expected = [eps + (1 - eps) * math.cos(math.pi * k / 8) for k in range(5)]
    assert cosine.tolist() == pytest.approx(expected, abs=1e-15)
    assert cosine[0] == 1.0 and cosine[-1] == pytest.approx(eps)
    assert bool((cosine[1:] < cosine[:-1]).all())
    # the first cosine step unmasks far fewer genes than the first uniform step: (t - s) / t
    assert 1 - cosine[1] < (1 - uniform[1]) / 3
    with pytest.raises(ValueError, match=r"time_grid.*uniform, cosine.*'linear'"):
        time_grid(4, eps, "linear")


def schedule_of(*args: object, **kwargs: object) -> tuple[object, ...]:
    found = resolve_schedule(*args, **kwargs)  # type: ignore[arg-type]
    return found["steps"], found["time_grid"], found["sampler"], found["entropy_bound"]


def test_steps_alone_keep_the_uniform_grid_and_nothing_gives_the_default() -> None:
    bound = DEFAULT_ENTROPY_BOUND
    assert schedule_of(None, None) == (DEFAULT_STEPS, DEFAULT_GRID, "euler", bound)
    assert schedule_of(50, None) == (50, "uniform", "euler", bound)
    assert schedule_of(None, "cosine") == (DEFAULT_STEPS, "cosine", "euler", bound)
    assert schedule_of(7, "cosine") == (7, "cosine", "euler", bound)


def test_a_model_schedule_is_what_a_request_naming_none_runs() -> None:
    calibrated = Schedule("entropy", 12, "uniform", 40.0)
    assert schedule_of(None, None, default=calibrated) == (12, "uniform", "entropy", 40.0)
    # a bound alone keeps the model's schedule with that bound
    assert schedule_of(None, None, None, 3.0, calibrated) == (12, "uniform", "entropy", 3.0)
    # steps alone are st3's schedule, whatever the model's: uniform Euler steps
    st3 = (50, "uniform", "euler", DEFAULT_ENTROPY_BOUND)
    assert schedule_of(50, None, default=calibrated) == st3
    # the model's own sampler named: its steps and bound; another sampler: the library's
    assert schedule_of(None, None, "entropy", None, calibrated) == (12, "uniform", "entropy", 40.0)
    assert schedule_of(None, None, "analytic", None, calibrated) == (
        DEFAULT_STEPS, "uniform", "analytic", DEFAULT_ENTROPY_BOUND)  # fmt: skip
    options = SamplingOptions.resolve(seed=3, default=calibrated)
    assert (options.sampler, options.steps, options.entropy_bound, options.seed) == (
        "entropy", 12, 40.0, 3)  # fmt: skip


def test_a_request_records_its_grid_only_when_it_is_not_uniform() -> None:
    uniform = request_of(cells_per_condition=2, steps=5)
    assert "time_grid" not in uniform.record()  # run ids and shard manifests of before hold
    assert request_of(2, steps=5, grid="cosine").record()["time_grid"] == "cosine"
    with pytest.raises(ValueError, match="time_grid"):
        request_of(2, steps=5, grid="log").validate()  # type: ignore[arg-type]


async def test_the_cosine_grid_gives_the_same_cells_through_api_cli_and_server(
    model_dir: Path, tmp_path: Path
) -> None:
    model = sedd.load(model_dir, device="cpu", precision="fp32")
    api = model.generate(3, condition="KRAS", steps=4, time_grid="cosine", seed=2)
    uniform = model.generate(3, condition="KRAS", steps=4, seed=2)
    assert not np.array_equal(api.X.toarray(), uniform.X.toarray())  # the grid matters
    out = tmp_path / "cosine.h5ad"
    argv = [
        "generate", "--model", str(model_dir), "--conditions", "KRAS", "--num-cells", "3",
        "--steps", "4", "--time-grid", "cosine", "--seed", "2", "--precision", "fp32",
        "--device", "cpu", "--out", str(out),
    ]  # fmt: skip
    assert sedd_main(argv) == 0
    from_cli = anndata.read_h5ad(out)
    np.testing.assert_array_equal(api.X.toarray(), from_cli.X.toarray())
    assert from_cli.uns["sedd"]["request"]["time_grid"] == "cosine"
    body = {"num_cells": 3, "condition": "KRAS", "steps": 4, "time_grid": "cosine", "seed": 2}
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/generate", json=body)
        h5ad = await client.post("/generate", json={**body, "format": "h5ad"})
        bad = await client.post("/generate", json={**body, "time_grid": "log"})
    assert response.status_code == 200
    np.testing.assert_array_equal(np.array(response.json()["counts"]), api.X.toarray())
    assert response.json()["metadata"]["time_grid"] == "cosine"
    served_cells = anndata.read_h5ad(io.BytesIO(h5ad.content))
    np.testing.assert_array_equal(served_cells.X.toarray(), api.X.toarray())
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "time_grid"]


async def test_a_request_without_steps_gets_the_default_schedule_everywhere(
    model_dir: Path,
) -> None:
    model = sedd.load(model_dir, device="cpu", precision="fp32")
    api = model.generate(2, condition="TP53", seed=4)
    assert api.uns["sedd"]["steps"] == DEFAULT_STEPS
    explicit = model.generate(2, condition="TP53", steps=DEFAULT_STEPS, time_grid=DEFAULT_GRID,
                              seed=4)  # fmt: skip
    np.testing.assert_array_equal(api.X.toarray(), explicit.X.toarray())
    settings = make_settings(model_dir).model_copy(update={"max_steps": 200})
    async with served(settings) as (client, _):
        response = await client.post("/generate", json={"num_cells": 2, "condition": "TP53",
                                                        "seed": 4})  # fmt: skip
    meta = response.json()["metadata"]
    assert (meta["steps"], meta["time_grid"]) == (DEFAULT_STEPS, DEFAULT_GRID)
    np.testing.assert_array_equal(np.array(response.json()["counts"]), api.X.toarray())


def test_the_cli_summary_counts_the_model_calls(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``sedd generate``'s forwards are the model's forward calls: row blocks of the fixed
    size, and no call for a step (or denoise) that finds nothing masked."""
    calls: list[int] = []
    original = _ST3Base.forward

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0].shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_ST3Base, "forward", counted)
    out = tmp_path / "cells.h5ad"
    argv = [
        "generate", "--model", str(model_dir), "--conditions", "KRAS", "TP53", "--num-cells",
        "3", "--steps", "10", "--seed", "0", "--precision", "fp32", "--device", "cpu",
        "--tokens-per-forward", str(2 * 12), "--out", str(out),
    ]  # fmt: skip
    assert sedd_main(argv) == 0
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert metrics["forwards"] == len(calls) and metrics["scale"] == "counts"
    assert set(calls) == {2}  # every call is one block of 2 rows (the 24-token budget)
    # 6 cells in 3 blocks: at most 10 steps + the denoise each; a 12-gene cell is often fully
    # unmasked before its denoise, and then leaves (its block's other row goes on alone)
    assert 3 * 5 <= len(calls) <= 3 * 11
    # a cell's forwards: each call holds one or two real rows (a lone row is padded)
    cell_forwards = metrics["forwards_per_cell"] * 6
    assert len(calls) <= round(cell_forwards) <= 2 * len(calls)
    assert metrics["genes_per_forward"] == pytest.approx(6 * 12 / cell_forwards)
    assert f"{len(calls)} forwards" in capsys.readouterr().out
