"""``impute(n_samples=k)``: ``.X`` stays the first draw, ``layers["mean_of_draws"]`` is the
per-cell mean of k draws, draw j of cell i on stream (seed, j * N + i); the same through the
Python API, ``sedd impute --n-samples`` and HTTP ``/impute``, and refused alike at each door."""

from __future__ import annotations

import io
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
from arrays import dense
from devices import DEVICE
from server_client import make_settings, served
from server_models import GENES, NUM_BINS, save_tiny_model

import sedd
from sedd.cli import main as sedd_main
from sedd.defaults import SamplingOptions
from sedd.diffusion.st3_samplers import EulerSampler
from sedd.engine import EngineSettings
from sedd.request.draws import MEAN_LAYER
from sedd.request.imputation import imputation_from_anndata
from sedd.request.plan import GenerationRequest, plan
from sedd.shards.job import prepare_shard
from sedd.shards.ranges import Shard

pytestmark = pytest.mark.anyio

GIVEN_GENES = ["GENE3", "GENE0", "GENE7"]
COUNTS = np.array([[1, 5, 0], [0, 2, 4], [3, 0, 1]])  # 3 cells x the 3 given genes
OBSERVED = [GENES.index(g) for g in GIVEN_GENES]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("draws") / "tiny")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> sedd.Model:
    return sedd.load(model_dir, device=str(DEVICE), precision="fp32")


def given() -> anndata.AnnData:
    names = pd.DataFrame(index=["cellA", "cellB", "cellC"])
    return anndata.AnnData(X=COUNTS.copy(), obs=names, var=pd.DataFrame(index=GIVEN_GENES))


def draws_by_hand(model: sedd.Model, k: int, *, steps: int, seed: int) -> np.ndarray:
    """(k, N, G) counts: draw j of the N cells sampled alone on streams j * N .. j * N + N - 1,
    with the library's one sampler (the control label, the given tokens fixed)."""
    n = COUNTS.shape[0]
    x_init = np.full((n, len(GENES)), NUM_BINS)  # the mask everywhere ...
    x_init[:, OBSERVED] = COUNTS  # ... but at the given genes
    loaded = model.loaded
    sampler = EulerSampler(loaded.model, loaded.noise, loaded.graph, precision=model.policy)
    labels = loaded.perturbation_labels(["ctrl"] * n)  # the control: no condition given
    start = torch.from_numpy(x_init)
    return np.stack([
        sampler.sample(
            steps=steps, seed=seed, first_cell=j * n, x_init=start, fixed=start != NUM_BINS,
            labels=labels,
        ).cpu().numpy()
        for j in range(k)
    ])  # fmt: skip


def test_one_draw_changes_nothing_and_more_draws_keep_x(model: sedd.Model) -> None:
    default = model.impute(given(), steps=4, seed=2)
    one = model.impute(given(), steps=4, seed=2, n_samples=1)
    three = model.impute(given(), steps=4, seed=2, n_samples=3)
    # one draw: the sampler's cells on streams 0..N-1, no layer, no record of draws
    by_hand = draws_by_hand(model, 1, steps=4, seed=2)[0]
    np.testing.assert_array_equal(dense(default.X), by_hand)
    np.testing.assert_array_equal(dense(one.X), by_hand)
    assert list(one.layers) == [] and list(default.layers) == []
    assert "n_samples" not in one.uns["sedd"] and "n_samples" not in one.uns["sedd"]["request"]
    assert one.uns["sedd"]["request"] == default.uns["sedd"]["request"]
    # three draws: .X is still the first, the cells keep their names and obs
    np.testing.assert_array_equal(dense(three.X), by_hand)
    assert list(three.obs_names) == ["cellA", "cellB", "cellC"]
    pd.testing.assert_frame_equal(three.obs, one.obs)
    assert three.uns["sedd"]["n_samples"] == 3 and three.uns["sedd"]["mean_layer"] == MEAN_LAYER
    assert three.uns["sedd"]["request"]["n_samples"] == 3


def test_mean_layer_is_the_mean_of_k_single_draws_on_streams_j_n_plus_i(
    model: sedd.Model,
) -> None:
    out = model.impute(given(), steps=4, seed=2, n_samples=4, batch_size=2)
    by_hand = draws_by_hand(model, 4, steps=4, seed=2)  # (4, 3, G)
    expected = (by_hand.astype(np.float64).sum(axis=0) / 4).astype(np.float32)
    layer = dense(out.layers[MEAN_LAYER])
    assert layer.dtype == np.float32 and layer.shape == (3, len(GENES))
    np.testing.assert_array_equal(layer, expected)
    # the draws differ (else the mean would say nothing), and the mean is a multiple of 1/4
    assert len({d.tobytes() for d in by_hand}) == 4
    np.testing.assert_array_equal(layer * 4, np.round(layer * 4))
    # observed genes keep their given count in the mean
    np.testing.assert_array_equal(layer[:, OBSERVED], COUNTS.astype(np.float32))


def test_same_seed_same_layer_on_any_batch_and_another_seed_another(model: sedd.Model) -> None:
    first = dense(model.impute(given(), steps=3, seed=7, n_samples=3).layers[MEAN_LAYER])
    again = model.impute(given(), steps=3, seed=7, n_samples=3, batch_size=1)
    np.testing.assert_array_equal(dense(again.layers[MEAN_LAYER]), first)
    other = dense(model.impute(given(), steps=3, seed=8, n_samples=3).layers[MEAN_LAYER])
    assert not np.array_equal(other, first)


async def test_cli_and_http_give_the_api_layer(
    model: sedd.Model, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = model.impute(given(), steps=4, seed=2, condition="MYC", n_samples=3)
    path = tmp_path / "given.h5ad"
    given().write_h5ad(path)
    out = tmp_path / "imputed.h5ad"
    argv = [
        "impute", str(path), "--model", str(model_dir), "--condition", "MYC", "--steps", "4",
        "--seed", "2", "--precision", "fp32", "--device", str(DEVICE), "--out", str(out),
        "--n-samples", "3", "--batch-size", "2",
    ]  # fmt: skip
    assert sedd_main(argv) == 0
    assert "3 cells x 12 genes (and the mean of 3 draws each)" in capsys.readouterr().out
    from_cli = anndata.read_h5ad(out)
    np.testing.assert_array_equal(dense(from_cli.X), dense(api.X))
    np.testing.assert_array_equal(dense(from_cli.layers[MEAN_LAYER]), dense(api.layers[MEAN_LAYER]))
    assert from_cli.layers[MEAN_LAYER].dtype == np.float32
    assert from_cli.uns["sedd"]["n_samples"] == 3

    body = {"genes": GIVEN_GENES, "counts": COUNTS.tolist(), "steps": 4, "seed": 2}
    body |= {"condition": "MYC", "n_samples": 3}
    async with served(make_settings(model_dir, max_cells_per_request=9)) as (client, _):
        answer = await client.post("/impute", json=body)
        h5ad = await client.post("/impute", json={**body, "format": "h5ad"})
        one = await client.post("/impute", json={**body, "n_samples": 1})
    assert answer.status_code == 200, answer.text
    np.testing.assert_array_equal(np.array(answer.json()["counts"]), dense(api.X))
    mean = np.array(answer.json()["mean_of_draws"], dtype=np.float32)
    np.testing.assert_array_equal(mean, dense(api.layers[MEAN_LAYER]))
    from_http = anndata.read_h5ad(io.BytesIO(h5ad.content))
    np.testing.assert_array_equal(dense(from_http.layers[MEAN_LAYER]), mean)
    np.testing.assert_array_equal(dense(from_http.X), dense(api.X))
    assert from_http.uns["sedd"]["n_samples"] == 3
    # one draw: the body it always had, without the key
    assert "mean_of_draws" not in one.json()
    assert one.json()["counts"] == answer.json()["counts"]


def test_api_refuses_bad_n_samples_in_one_line(model: sedd.Model) -> None:
    for bad in (0, 65, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"`n_samples` must be an integer from 1 to 64, got"):
            model.impute(given(), steps=2, n_samples=bad)  # type: ignore[arg-type]
    sampling = SamplingOptions.resolve(2, None)
    generated = GenerationRequest(2, ("KRAS",), None, sampling, n_samples=3)
    with pytest.raises(ValueError, match="`n_samples` must be 1 for cells generated without"):
        plan(model.loaded, generated)


def test_a_sharded_run_refuses_several_draws(model: sedd.Model, tmp_path: Path) -> None:
    imputation = imputation_from_anndata(model.loaded, given())
    sampling = SamplingOptions.resolve(2, None)
    request = GenerationRequest(3, ("ctrl",), None, sampling, imputation=imputation, n_samples=2)
    with pytest.raises(ValueError, match="`n_samples` must be 1 for a sharded run, got 2"):
        prepare_shard(
            plan(model.loaded, request), model.policy, tmp_path, Shard(0, 1), EngineSettings()
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["0", "65"])
def test_cli_refuses_bad_n_samples_with_exit_2_and_one_line(
    bad: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "given.h5ad"
    given().write_h5ad(path)
    out = tmp_path / "o.h5ad"
    argv = ["impute", str(path), "--model", str(model_dir), "--n-samples", bad, "--out", str(out)]
    assert sedd_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`n_samples` must be an integer from 1 to 64, got {bad};" in err[0]
    assert not out.exists()


def test_cli_refuses_a_non_integer_n_samples_as_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        sedd_main(["impute", "x.h5ad", "--n-samples", "two"])
    assert exited.value.code == 2
    assert "--n-samples: invalid int value: 'two'" in capsys.readouterr().err


async def test_http_refuses_bad_n_samples_naming_the_field(model_dir: Path) -> None:
    body = {"genes": GIVEN_GENES, "counts": COUNTS.tolist(), "steps": 2}
    async with served(make_settings(model_dir)) as (client, _):
        for bad in (0, 65, "2", True, 1.5):
            answer = await client.post("/impute", json={**body, "n_samples": bad})
            assert answer.status_code == 422, (bad, answer.text)
            assert answer.json()["detail"][0]["loc"] == ["body", "n_samples"]
        # 3 cells x 3 draws = 9 cell draws against max_cells_per_request 8
        answer = await client.post("/impute", json={**body, "n_samples": 3})
        assert answer.status_code == 422
        (detail,) = answer.json()["detail"]
        assert detail["loc"] == ["body", "n_samples"] and detail["input"] == 3
        assert "3 cells x 3 draws = 9 cell draws; the limit is 8" in detail["msg"]


async def test_cost_admission_counts_every_draw(model_dir: Path) -> None:
    body = {"genes": GIVEN_GENES, "counts": COUNTS.tolist(), "steps": 4}
    settings = make_settings(model_dir, max_cells_per_request=9, max_cell_steps=12)
    async with served(settings) as (client, _):
        one = await client.post("/impute", json=body)  # 3 cells x 4 steps = 12: admitted
        two = await client.post("/impute", json={**body, "n_samples": 2})
    assert one.status_code == 200, one.text
    assert two.status_code == 422
    (detail,) = two.json()["detail"]
    assert detail["type"] == "too_costly"
    assert detail["ctx"] == {"cell_steps": 24, "max_cell_steps": 12}
