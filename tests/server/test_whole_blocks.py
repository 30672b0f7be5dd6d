"""The server's tick in whole row blocks (issue "The first H100 run, round 2", item 2):
``max_rows_per_forward=256`` over blocks of 171 rows (the bundled model on an H100) computed 342
rows for 256, a quarter of every full tick padding. The server now rounds its tick up to whole
blocks, as the offline path does, says so at start-up, and ``/metrics`` shows rows computed
against rows stepped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from server_client import make_settings, served
from server_models import save_tiny_model, tiny_config

from server.app import startup_line

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("blocks") / "tiny")


def _sample(metrics: str, name: str) -> float:
    [value] = re.findall(rf"^{name}(?:{{model=\"tiny\"}})? ([0-9.e+]+)$", metrics, re.M)
    return float(value)


async def test_the_tick_is_whole_blocks_and_metrics_show_rows_computed_per_stepped(
    model_dir: Path,
) -> None:
    block, genes = 3, tiny_config().num_genes
    settings = make_settings(model_dir, max_rows_per_forward=8, max_cells_per_request=9,
                             tokens_per_forward=block * genes)  # fmt: skip
    async with served(settings) as (client, app):
        service = app.state.service
        engine = service.engine
        before = (await client.get("/metrics")).text
        response = await client.post("/generate", json={"num_cells": 9, "steps": 3, "seed": 1})
        after = (await client.get("/metrics")).text
    assert engine.sampler.block_rows == block
    assert engine.max_rows_per_forward == 9  # 8 rounded up to three blocks of 3
    line = startup_line(service)
    assert "9 rows a step (max_rows_per_forward 8, rounded up to whole blocks)" in line
    assert "in forwards of 3 rows" in line
    assert response.status_code == 200 and len(response.json()["counts"]) == 9
    assert _sample(before, "sedd_rows_computed_per_stepped") == 0.0  # the warm-up is not counted
    forwards = _sample(after, "sedd_forwards_total")
    stepped, computed = (
        _sample(after, f"sedd_rows_{kind}_total") for kind in ("stepped", "computed")
    )
    assert computed == block * forwards and 0 < stepped <= computed
    assert _sample(after, "sedd_rows_computed_per_stepped") == pytest.approx(computed / stepped)
