"""Every output records what the engine ran, not what the request asked: the rows and tokens of
each model forward (its fixed shape, which decides the cells) and the most rows a tick steps.

Before, a server ``.h5ad`` recorded ``tokens_per_forward: None`` and ``batch_size: 64`` whatever
the engine used. Checked through the API, a CLI file, a CLI shard, and the server's ``.h5ad`` and
JSON answers, each with a forward of 3 rows (tokens_per_forward 3 x genes + 1: the record holds
the rows' own tokens, 3 x genes, not the budget asked for).
"""

from __future__ import annotations

import io
from pathlib import Path

import anndata
import pytest
from devices import DEVICE
from server_client import make_settings, served
from server_models import PERTURBATIONS, save_tiny_model

import sedd
from sedd.cli import main as sedd_main

ROWS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("engine") / "tiny")


def expected(genes: int, rows_per_tick: int) -> dict[str, int]:
    return {"block_rows": ROWS, "tokens_per_forward": ROWS * genes, "rows_per_tick": rows_per_tick}


def test_api_and_cli_record_the_forward_shape_they_ran(model_dir: Path, tmp_path: Path):
    model = sedd.load(model_dir, device=str(DEVICE), precision="fp32")
    genes = len(model.genes)
    budget = ROWS * genes + 1
    model = sedd.load(model_dir, device=str(DEVICE), precision="fp32", tokens_per_forward=budget)
    cells = model.generate(2, condition=PERTURBATIONS[1], steps=2, batch_size=4)
    assert cells.uns["sedd"]["engine"] == expected(genes, rows_per_tick=6)  # 4 rows: 2 blocks
    flags = ["--model", str(model_dir), "--conditions", PERTURBATIONS[1], "--cells", "2",
             "--steps", "2", "--precision", "fp32", "--device", str(DEVICE),
             "--tokens-per-forward", str(budget), "--batch-size", "7"]  # fmt: skip
    out = tmp_path / "cells.h5ad"
    assert sedd_main(["generate", *flags, "--out", str(out)]) == 0
    assert anndata.read_h5ad(out).uns["sedd"]["engine"] == expected(genes, rows_per_tick=9)
    assert sedd_main(["generate", *flags, "--out-dir", str(tmp_path / "run")]) == 0
    (shard,) = (tmp_path / "run").rglob("*.h5ad")
    assert anndata.read_h5ad(shard).uns["sedd"]["engine"] == expected(genes, rows_per_tick=9)


@pytest.mark.anyio
async def test_the_server_records_its_engines_forward_shape(model_dir: Path):
    genes = len(sedd.load(model_dir, device=str(DEVICE), precision="fp32").genes)
    settings = make_settings(model_dir, tokens_per_forward=ROWS * genes + 1)
    body = {"condition": PERTURBATIONS[1], "num_cells": 2, "steps": 2}
    async with served(settings) as (client, _):
        answer = await client.post("/generate", json=body)
        h5ad = await client.post("/generate", json={**body, "format": "h5ad"})
    # the server's tick: max_rows_per_forward rounded up to whole blocks of ROWS
    whole = -(-settings.max_rows_per_forward // ROWS) * ROWS
    assert whole != settings.max_rows_per_forward  # (64 rows over blocks of 3: 66)
    record = expected(genes, rows_per_tick=whole)
    assert answer.status_code == 200 and answer.json()["metadata"]["engine"] == record
    assert h5ad.status_code == 200
    assert anndata.read_h5ad(io.BytesIO(h5ad.content)).uns["sedd"]["engine"] == record
