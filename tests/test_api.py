"""The Python API: ``sedd.load(...)`` and ``Model.generate/predict/impute`` return AnnData whose
cells equal those of the CLI and the server for the same request."""

from __future__ import annotations

import io
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from arrays import dense
from devices import DEVICE
from engine_models import request_of
from server_client import make_settings, served
from server_models import CELL_TYPES, GENES, NUM_BINS, PERTURBATIONS, save_tiny_model

import sedd
from sedd.cli import main as sedd_main
from sedd.diffusion.sampling import Sampler
from sedd.diffusion.st3_samplers import EulerSampler
from sedd.engine import Engine
from sedd.request.plan import plan
from sedd.run import run_plan

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("api") / "tiny")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> sedd.Model:
    return sedd.load(model_dir, device=str(DEVICE), precision="fp32")


def cli(*argv: str) -> None:
    assert sedd_main(list(argv)) == 0


async def test_api_cli_and_server_give_the_same_cells_for_the_same_request(
    model: sedd.Model, model_dir: Path, tmp_path: Path
) -> None:
    api = model.generate(3, condition="KRAS", cell_type="B", steps=4, seed=5, batch_size=2)
    out = tmp_path / "cli.h5ad"
    cli(
        "generate", "--model", str(model_dir), "--conditions", "KRAS", "--cell-type", "B",
        "--cells", "3", "--steps", "4", "--seed", "5", "--precision", "fp32",
        "--device", str(DEVICE), "--batch-size", "3", "--out", str(out),
    )  # fmt: skip
    from_cli = anndata.read_h5ad(out)
    body = {"num_cells": 3, "condition": "KRAS", "cell_type": "B", "steps": 4, "seed": 5}
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/generate", json={**body, "format": "h5ad"})
    assert response.status_code == 200
    from_server = anndata.read_h5ad(io.BytesIO(response.content))
    assert api.shape == from_cli.shape == from_server.shape == (3, len(GENES))
    np.testing.assert_array_equal(dense(api.X), dense(from_cli.X))
    np.testing.assert_array_equal(dense(api.X), dense(from_server.X))
    assert dense(api.X).max() < NUM_BINS and dense(api.X).sum() > 0
    assert list(api.var_names) == GENES
    assert list(api.obs["perturbation"]) == ["KRAS"] * 3 == list(api.obs["condition"])
    assert list(api.obs["cell_type"]) == ["B"] * 3
    # the same cells get the same names and obs (seed, stream, ...) on every path
    pd.testing.assert_frame_equal(from_cli.obs, api.obs)
    pd.testing.assert_frame_equal(from_server.obs, api.obs)
    assert list(api.obs["cell_index"]) == [0, 1, 2] and list(api.obs["seed"]) == [5] * 3
    assert api.uns["sedd"]["seed"] == 5 and api.uns["sedd"]["steps"] == 4


async def test_predict_numbers_cells_the_same_through_api_cli_and_server(
    model: sedd.Model, model_dir: Path, tmp_path: Path
) -> None:
    api = model.predict(["TP53", "MYC"], cells_per_perturbation=2, steps=3, seed=1)
    assert list(api.obs["perturbation"]) == ["ctrl", "ctrl", "TP53", "TP53", "MYC", "MYC"]
    out = tmp_path / "p.h5ad"
    cli(
        "predict", "--model", str(model_dir), "--perturbations", "TP53", "MYC",
        "--cells-per-perturbation", "2", "--steps", "3", "--seed", "1", "--precision", "fp32",
        "--device", str(DEVICE), "--out", str(out),
    )  # fmt: skip
    np.testing.assert_array_equal(dense(api.X), dense(anndata.read_h5ad(out).X))
    body = {"perturbations": ["TP53", "MYC"], "cells_per_perturbation": 2, "steps": 3, "seed": 1}
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/predict", json=body)
    groups = response.json()["perturbations"]
    from_server = np.concatenate([np.array(g["counts"]) for g in groups])
    np.testing.assert_array_equal(dense(api.X), from_server)


def test_model_exposes_its_vocabulary_card_and_precision(model: sedd.Model) -> None:
    assert model.genes == GENES
    assert model.conditions == PERTURBATIONS and model.control == "ctrl"
    assert model.cell_types == CELL_TYPES
    assert model.card["num_genes"] == len(GENES) and len(model.card["sha256"]) == 64
    # a GPU reports its index ("cuda:0" for "cuda")
    device = model.loaded.device
    assert device.type == DEVICE.type and model.precision["device"] == str(device)
    assert model.precision["amp_dtype"] == "fp32"
    assert "fp32_fallbacks" not in model.precision
    assert repr(model) == f"sedd.Model(tiny: 12 genes, 5 conditions, fp32 on {device})"


def test_generate_without_a_condition_covers_every_condition_in_order(model: sedd.Model) -> None:
    cells = model.generate(2, steps=2, seed=0)
    assert list(cells.obs["perturbation"]) == [name for name in PERTURBATIONS for _ in range(2)]
    assert list(cells.obs["sample_idx"]) == [0, 1] * len(PERTURBATIONS)
    again = model.generate(2, condition=["KRAS"], steps=2, seed=0)
    # cell i is stream (seed, i): KRAS cells are cells 2, 3 of the full request, 0, 1 here
    assert not np.array_equal(dense(again.X), dense(cells.X)[2:4])
    alone = model.generate(2, condition="KRAS", steps=2, seed=0, batch_size=1)
    np.testing.assert_array_equal(dense(again.X), dense(alone.X))


def test_impute_keeps_given_counts_drops_unknown_genes_and_samples_the_rest(
    model: sedd.Model,
) -> None:
    counts = np.array([[1, 5, 2], [0, 2, 4]])
    given = anndata.AnnData(
        X=sp.csr_matrix(counts),
        obs=pd.DataFrame(index=["cellA", "cellB"]),
        var=pd.DataFrame(index=["GENE3", "NOT_A_GENE", "GENE0"]),
    )
    with pytest.warns(UserWarning, match=r"1 gene\(s\) of the data are not in the model.*NOT_A"):
        out = model.impute(given, steps=5, seed=3)
    x = dense(out.X)
    assert out.shape == (2, len(GENES)) and list(out.obs_names) == ["cellA", "cellB"]
    np.testing.assert_array_equal(x[:, [3, 0]], counts[:, [0, 2]])
    assert list(out.var["observed"]) == [g in ("GENE0", "GENE3") for g in GENES]
    assert out.uns["sedd"]["imputation"]["dropped_genes"] == ["NOT_A_GENE"]
    assert list(out.obs["perturbation"]) == ["ctrl", "ctrl"]  # the control by default
    # the library's one sampler gives the same cells for the same tokens and streams
    x_init = torch.full((2, len(GENES)), NUM_BINS, dtype=torch.long)
    x_init[:, [3, 0]] = torch.tensor(counts[:, [0, 2]])
    sampler = EulerSampler(
        model.loaded.model, model.loaded.noise, model.loaded.graph, precision=model.policy
    )
    solo = sampler.sample(
        steps=5, seed=3, x_init=x_init, fixed=x_init != NUM_BINS, labels=torch.tensor([0, 0])
    )
    np.testing.assert_array_equal(x, solo.cpu().numpy())


async def test_impute_cli_and_server_match_the_api(
    model: sedd.Model, model_dir: Path, tmp_path: Path
) -> None:
    counts = [[1, 5], [0, 2]]
    given = anndata.AnnData(X=np.array(counts), var=pd.DataFrame(index=["GENE3", "GENE0"]))
    path = tmp_path / "given.h5ad"
    given.write_h5ad(path)
    api = model.impute(given, steps=4, seed=2, condition="MYC")
    out = tmp_path / "imputed.h5ad"
    cli(
        "impute", str(path), "--model", str(model_dir), "--condition", "MYC", "--steps", "4",
        "--seed", "2", "--precision", "fp32", "--device", str(DEVICE), "--out", str(out),
    )  # fmt: skip
    np.testing.assert_array_equal(dense(api.X), dense(anndata.read_h5ad(out).X))
    body = {"genes": ["GENE3", "GENE0"], "counts": counts, "steps": 4, "seed": 2}
    async with served(make_settings(model_dir)) as (client, _):
        response = await client.post("/impute", json={**body, "condition": "MYC"})
    np.testing.assert_array_equal(dense(api.X), np.array(response.json()["counts"]))


def test_bad_requests_get_one_line_errors_naming_the_field(model: sedd.Model) -> None:
    with pytest.raises(ValueError, match="unknown perturbation 'KRSA'; did you mean 'KRAS'"):
        model.generate(1, condition="KRSA", steps=2)
    with pytest.raises(ValueError, match="`steps` must be >= 1, got 0"):
        model.generate(1, condition="KRAS", steps=0)
    with pytest.raises(ValueError, match="`cells_per_condition` must be >= 1, got 0"):
        model.generate(0, condition="KRAS")
    genes_unknown = anndata.AnnData(X=np.ones((1, 2)), var=pd.DataFrame(index=["A", "B"]))
    with pytest.raises(ValueError, match="none of the data's 2 genes"):
        model.impute(genes_unknown)


def test_bundled_model_api_equals_sedd_generate(tmp_path: Path) -> None:
    bundled = sedd.load(device=str(DEVICE))
    cells = bundled.generate(8, condition="CD14+ Monocyte", steps=5, seed=3)
    assert cells.shape == (8, 765)
    out = tmp_path / "F.h5ad"
    cli(
        "generate", "--conditions", "CD14+ Monocyte", "--cells", "8", "--steps", "5",
        "--seed", "3", "--device", str(DEVICE), "--out", str(out),
    )  # fmt: skip
    np.testing.assert_array_equal(dense(cells.X), dense(anndata.read_h5ad(out).X))
    predicted = bundled.predict(["CD19+ B"], cells_per_perturbation=3, steps=5, seed=3)
    assert isinstance(predicted, anndata.AnnData) and predicted.shape == (6, 765)


def test_dir_lists_the_api_and_the_bar_counts_whole_cells(monkeypatch) -> None:
    assert dir(sedd) == ["Model", "SamplingOptions", "__version__", "load"]
    import sedd.run as run
    from sedd.engine import StepProgress

    class Bar:  # tqdm's interface as progress_bar uses it
        def __init__(self, total: int, **_: object) -> None:
            self.total, self.n, self.shown = total, 0, []

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def update(self, k: int) -> None:
            self.n += k
            self.shown.append(self.n)

    bars: list[Bar] = []
    monkeypatch.setattr(run, "tqdm", lambda **kw: bars.append(Bar(**kw)) or bars[-1])
    with run.progress_bar(3, "sampling") as hook:  # 3 cells, finishing 0, 1, 0, 2 at a time
        for finished in (0, 1, 0, 2):
            hook(StepProgress(step=1, steps=5, rows=3, fraction_masked=0.5, finished=finished))
    assert bars[0].total == 3 and bars[0].shown == [1, 3]  # whole cells, never a fraction
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a script logging to a file: no bar
    assert run.interactive() is False


def test_a_model_reuses_one_sampler_and_its_cuda_graphs_across_calls(
    model: sedd.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampler holds the captured CUDA graphs (``Sampler.graphs``): one per call would
    capture them again on every call. A model keeps one per forward block setting; reusing it
    changes no cell."""
    samplers: list[Sampler] = []
    init = Engine.__init__

    def spy(engine: Engine, sampler: Sampler, *args: object, **kwargs: object) -> None:
        samplers.append(sampler)
        init(engine, sampler, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "__init__", spy)
    fresh = sedd.Model(model.loaded, model.policy)
    request = {"condition": "KRAS", "steps": 3, "seed": 4, "progress": False}
    first, second = fresh.generate(3, **request), fresh.generate(3, **request)
    fresh.tokens_per_forward = len(GENES)  # one row a forward: another block shape
    one_row = fresh.generate(3, **request)
    fresh.tokens_per_forward = None
    third = fresh.generate(3, **request)
    assert samplers[0] is samplers[1] is samplers[3] and samplers[0].graphs is samplers[1].graphs
    assert samplers[2] is not samplers[0] and samplers[2].block_rows == 1
    for cells in (second, one_row, third):
        np.testing.assert_array_equal(dense(cells.X), dense(first.X))
    request = request_of(cells_per_condition=1, conditions=("KRAS",), steps=2)
    with pytest.raises(ValueError, match="`sampler` runs fp32 forwards of 1 rows, this run fp32"):
        run_plan(plan(fresh.loaded, request), fresh.policy, sampler=samplers[2])


def test_threads_are_set_where_sampling_starts(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another library in the process (scanpy's normalize_total) may change torch's threads;
    ``threads`` (and ``SEDD_THREADS``, and ``--threads``) put them back where a run starts, and
    never change a cell."""
    before = torch.get_num_threads()
    try:
        model = sedd.load(model_dir, device=str(DEVICE), precision="fp32", threads=1)
        want = model.generate(2, condition=PERTURBATIONS[0], steps=2, seed=4)
        torch.set_num_threads(2)  # what the other library did
        cells = model.generate(2, condition=PERTURBATIONS[0], steps=2, seed=4)
        assert torch.get_num_threads() == 1
        np.testing.assert_array_equal(dense(cells.X), dense(want.X))
        torch.set_num_threads(2)
        monkeypatch.setenv("SEDD_THREADS", "1")
        sedd.load(model_dir, device=str(DEVICE), precision="fp32").generate(
            1, condition=PERTURBATIONS[0], steps=1
        )
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.delenv("SEDD_THREADS")
        cli("generate", "--model", str(model_dir), "--conditions", PERTURBATIONS[0], "--cells",
            "1", "--steps", "1", "--threads", "1", "--precision", "fp32",
            "--out", str(tmp_path / "t.h5ad"))  # fmt: skip
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match=r"`threads` must be a whole number >= 1"):
            sedd.load(model_dir, device=str(DEVICE), threads=0)
        monkeypatch.setenv("SEDD_THREADS", "two")
        with pytest.raises(ValueError, match=r"SEDD_THREADS='two': must be a whole number"):
            sedd.load(model_dir, device=str(DEVICE))
    finally:
        torch.set_num_threads(before)


def test_a_cell_type_model_speaks_of_cell_types_and_a_perturbation_model_of_perturbations(
    model: sedd.Model,
) -> None:
    """The bundled model's labels are cell types: its Python card names no perturbations and no
    control (as its HTTP card), but a default condition; a perturbation model keeps both."""
    bundled = sedd.load(device="cpu", precision="fp32")
    card = bundled.card
    assert card["label_kind"] == "cell_type"
    assert card["perturbations"] is None and card["control_label"] is None
    assert bundled.control is None
    assert card["default_condition"] == bundled.default_condition == "Dendritic"
    assert card["conditions"] == bundled.conditions and "Dendritic" in bundled.conditions
    assert model.card["perturbations"] == PERTURBATIONS and model.control == "ctrl"
    assert model.card["default_condition"] == model.default_condition == "ctrl"
