"""``sedd serve --genes/--perturbation-map/--vectors`` (or ``SEDD_GENES`` ...): the side files
``sedd generate`` takes reach the served model's load, in one process and in each Ray replica;
a path that is not a file, and ``--replicas`` without Ray, are one line each.

The model is st3's ``tiny_pert`` fixture (64 unnamed genes, five perturbations named by
``perturbation_names_all.txt``); ``sedd serve`` runs in-process with uvicorn replaced by a
function that keeps the app, which the test then drives over ASGI.
"""

from __future__ import annotations

import io
import logging
import pickle
import sys
from pathlib import Path

import anndata
import httpx
import pytest
import torch
from devices import DEVICE
from fastapi import FastAPI
from server_client import make_settings

from sedd.cli import main
from server.ray.replicas import replica_app

pytestmark = pytest.mark.anyio

EXPERIMENTS = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"
NAMES = [f"G{i:02d}" for i in range(64)]
SERVE = ["serve", "--model", str(EXPERIMENTS / "tiny_pert"), "--device", str(DEVICE),
         "--precision", "fp32", "--log-level", "warning"]  # fmt: skip


@pytest.fixture
def gene_file(tmp_path: Path) -> Path:
    path = tmp_path / "genes.txt"
    path.write_text("\n".join(NAMES) + "\n")
    return path


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[FastAPI]:
    """The apps ``sedd serve`` would have run under uvicorn (loaded already: its preload)."""
    apps: list[FastAPI] = []
    monkeypatch.setattr("server.serve.serve", lambda app, settings: apps.append(app))
    return apps


async def _post(app: FastAPI, route: str, body: dict[str, object]) -> httpx.Response:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sedd.test") as client:
            return await client.post(route, json=body)


async def test_serve_genes_flag_names_the_served_cells(gene_file: Path, kept: list) -> None:
    assert main([*SERVE, "--genes", str(gene_file)]) == 0
    body = {"perturbations": ["GENE_A"], "cells_per_perturbation": 1, "steps": 2, "format": "h5ad"}
    response = await _post(kept[0], "/predict", body)
    assert response.status_code == 200, response.text
    cells = anndata.read_h5ad(io.BytesIO(response.content))
    assert list(cells.var_names) == NAMES
    assert list(cells.obs["perturbation"]) == ["non-targeting", "GENE_A"]
    assert cells.uns["sedd"]["genes_by_position"] is False


async def test_serve_reads_the_side_files_from_sedd_variables(
    tmp_path: Path, gene_file: Path, kept: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    labels = ["ctrl", "P1", "P2", "P3", "P4"]
    mapping = tmp_path / "labels.txt"
    mapping.write_text("\n".join(labels) + "\n")
    monkeypatch.setenv("SEDD_GENES", str(gene_file))
    monkeypatch.setenv("SEDD_PERTURBATION_MAP", str(mapping))
    assert main(SERVE) == 0
    response = await _post(kept[0], "/generate", {"num_cells": 1, "condition": "P3", "steps": 2})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["genes"] == NAMES
    assert [cell["condition"] for cell in answer["cells"]] == ["P3"]


async def test_serve_vectors_flag_gives_the_vectors_names_as_labels(
    tmp_path: Path, kept: list
) -> None:
    experiment = EXPERIMENTS / "tiny_pert_ct_esm"
    given = torch.load(experiment / "protein_embeddings.pt", weights_only=True)
    renamed = {f"vec_{name}": vector for name, vector in given.items()}
    vectors = tmp_path / "vectors.pt"
    torch.save(renamed, vectors)
    argv = [*SERVE, "--model", str(experiment), "--vectors", str(vectors)]
    assert main(argv) == 0
    service = kept[0].state.preloaded.default
    assert service.loaded.conditions == list(renamed)
    assert service.settings.vectors == vectors


def test_the_positional_genes_warning_says_how_the_server_takes_a_gene_list(
    kept: list, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sedd.server"):
        assert main(SERVE) == 0
    [line] = [r.getMessage() for r in caplog.records if "GENES ARE POSITIONAL" in r.getMessage()]
    assert line.endswith("(sedd serve: --genes FILE or SEDD_GENES=FILE)")
    assert kept[0].state.preloaded.default.loaded.config.genes[:2] == ["0", "1"]


def test_a_side_file_that_is_not_there_is_one_line_naming_the_flag(
    tmp_path: Path, kept: list, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "genes.txt"
    assert main([*SERVE, "--genes", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"sedd serve: error: --genes {missing} (SEDD_GENES) is not a file; pass an existing "
        "file, or leave --genes out.\n"
    )
    assert kept == []  # refused before anything loaded or listened


def test_relative_side_files_are_made_absolute_for_replicas_elsewhere(
    tmp_path: Path, gene_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = make_settings(EXPERIMENTS / "tiny_pert", genes=Path("genes.txt"))
    assert settings.genes == gene_file
    assert pickle.loads(pickle.dumps(settings)).genes == gene_file  # as Ray ships it


async def test_each_replica_loads_the_side_files(gene_file: Path) -> None:
    settings = make_settings(EXPERIMENTS / "tiny_pert", genes=gene_file)
    app = replica_app(pickle.loads(pickle.dumps(settings)), torch.get_num_threads())
    response = await _post(app, "/generate", {"num_cells": 1, "steps": 2})
    assert response.status_code == 200, response.text
    assert response.json()["genes"] == NAMES


def test_replicas_without_ray_is_one_line_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    assert main([*SERVE, "--replicas", "2"]) == 2
    assert capsys.readouterr().err == (
        "sedd serve: error: --replicas needs Ray Serve: pip install -e '.[ray]' (or leave out "
        "--replicas for one process).\n"
    )
