"""``expected=True``: per draw, each sampled gene's mean count under the distribution it was drawn
from (``sedd.diffusion.expected``), averaged over the draws as ``layers["expected_counts"]``.

Exact on models whose distributions are fixed, for every kind of reverse step, temperature and
the final denoise; the cells never change; observed genes keep their count; the layer averages
the draws and has less variance than the draws themselves; the same through the Python API,
``sedd impute --expected`` and HTTP ``/impute`` (and its stream); refused in one line where it
cannot be given; no host sync on the step path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
from arrays import dense
from devices import DEVICE, needs_cuda
from engine_models import BINS, FP32, GENES, LOADED, job, run_until_idle, solo
from server_client import make_settings, served
from server_models import save_tiny_model

import sedd
from sedd.cli import main as sedd_main
from sedd.defaults import SamplingOptions
from sedd.diffusion.graph import graph_from_config
from sedd.diffusion.noise import noise_from_config
from sedd.diffusion.sampling import Sampler, StepBranches, StepRows
from sedd.engine import Engine, EngineJob, EngineSettings, ModelLimits
from sedd.engine.stepping import Stepper
from sedd.request.draws import EXPECTED_LAYER, MEAN_LAYER
from sedd.request.imputation import imputation_from_anndata
from sedd.request.plan import GenerationRequest, plan, run_id
from sedd.shards.job import prepare_shard
from sedd.shards.ranges import Shard

pytestmark = pytest.mark.anyio

GIVEN_GENES = ["GENE3", "GENE0", "GENE7"]
COUNTS = np.array([[1, 5, 0], [0, 2, 4], [3, 0, 1]])  # 3 cells x the 3 given genes


class FixedModel(torch.nn.Module):
    """Its output ignores the cell: every gene is drawn from the same distribution at whatever
    step it commits, softmax(logits[g, :mask] / T). As a score model (SEDD's convention) it
    gives log p0 - log(e^sigma - 1) over the real tokens and 0 at the mask."""

    def __init__(self, logits: torch.Tensor, parametrisation: str) -> None:
        super().__init__()
        self.register_buffer("logits", logits)  # (G, V)
        self.parametrisation = parametrisation
        self.vocab_size = logits.shape[1]
        self.mask_index = self.vocab_size - 1

    def forward(self, x, sigma, labels=None, cell_types=None):
        out = self.logits.repeat(x.shape[0], 1, 1)  # (B, G, V): a fresh tensor, as a network's
        if self.parametrisation == "x0":
            return out
        log_p0 = torch.log_softmax(out[..., :-1], dim=-1)
        log_score = log_p0 - torch.log(torch.expm1(sigma.float()))[:, None, None]
        return torch.cat([log_score, torch.zeros_like(out[..., -1:])], dim=-1)


def fixed_engine(bins: int, parametrisation: str, genes: int = 8) -> tuple[Engine, torch.Tensor]:
    torch.manual_seed(bins)
    logits = torch.randn(genes, bins + 1) * 2.0
    model = FixedModel(logits, parametrisation).to(DEVICE)
    graph = graph_from_config({"type": "absorb", "dim": bins + 1})
    noise = noise_from_config({"type": "loglinear", "eps": 1e-3})
    sampler = Sampler(model, noise, graph, precision=FP32, block_rows=3, device=DEVICE)  # 2 blocks
    limits = ModelLimits(num_genes=genes, num_perturbations=0)
    return Engine(sampler, limits, max_rows_per_forward=8), logits


def analytic_means(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """(G,) sum_k p_k k, p = softmax(logits[:, :mask] / T), in float64."""
    p = torch.softmax(logits[:, :-1].double() / temperature, dim=-1)
    return (p * torch.arange(p.shape[1], dtype=torch.float64)).sum(-1).numpy()


def given_tokens(cells: int, genes: int, mask: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x_init (the mask but at two observed genes a cell) and the fixed positions."""
    x = torch.full((cells, genes), mask)
    for i in range(cells):
        x[i, i % genes] = i % 3
        x[i, (i + 3) % genes] = 1
    return x, x != mask


def run_job(engine: Engine, engine_job: EngineJob) -> tuple[torch.Tensor, torch.Tensor | None]:
    handle = engine.submit(engine_job)
    run_until_idle(engine)
    result = handle.future.result(timeout=0)
    return result.tokens, result.expected


@pytest.mark.parametrize(("bins", "parametrisation"), [(6, "x0"), (70, "x0"), (6, "score")])
@pytest.mark.parametrize("sampler", ["euler", "analytic", "entropy"])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_layer_is_the_mean_of_the_distribution_each_gene_was_drawn_from(
    bins: int, parametrisation: str, sampler: str, temperature: float
) -> None:
    engine, logits = fixed_engine(bins, parametrisation)
    x, fixed = given_tokens(5, 8, bins)
    # eps = 0.5: about half the genes are left for the final denoise
    options = SamplingOptions(steps=2, sampler=sampler, temperature=temperature, seed=3)
    tokens, expected = run_job(engine, EngineJob(5, options, x_init=x, fixed=fixed, eps=0.5,
                                                 expected=True))  # fmt: skip
    assert expected is not None and expected.dtype == torch.float32 and expected.shape == (5, 8)
    want = np.broadcast_to(analytic_means(logits, temperature), (5, 8))
    np.testing.assert_allclose(expected[~fixed].numpy(), want[~fixed.numpy()], rtol=2e-6)
    np.testing.assert_array_equal(expected[fixed].numpy(), x[fixed].float().numpy())
    assert (tokens != bins).all()  # every gene drawn, the observed ones kept
    assert torch.equal(tokens[fixed], x[fixed])
    if sampler != "entropy":  # the final denoise drew genes the grid left masked
        undenoised, _ = run_job(engine, EngineJob(5, options, x_init=x, fixed=fixed, eps=0.5,
                                                  denoise=False))  # fmt: skip
        assert (undenoised == bins).sum() >= 5


def imputed_job(n: int, **kw: object) -> EngineJob:
    mask = LOADED.graph.dim - 1
    x, fixed = given_tokens(n, GENES, mask)
    return job(n, x_init=x, fixed=fixed, **kw)


@pytest.mark.parametrize(
    "options",
    [
        {"sampler": "euler"},
        {"sampler": "analytic", "temperature": 0.7},
        {"sampler": "entropy", "entropy_bound": 0.5},
        {"sampler": "euler", "grid": "cosine", "temperature": 1.6},
    ],
)
def test_the_cells_are_the_same_with_and_without_it_in_one_engine(options: dict) -> None:
    """A job with the option and the same job without it, stepped together in shared forwards:
    the same tokens, equal to the reference loop's; only the first has expected counts."""
    on, off = (imputed_job(6, steps=4, seed=5, expected=e, **options) for e in (True, False))
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=16)
    handles = [engine.submit(j) for j in (on, off)]
    run_until_idle(engine)
    with_it, without = (h.future.result(timeout=0) for h in handles)
    assert torch.equal(with_it.tokens, without.tokens)
    assert torch.equal(without.tokens, solo(off))
    assert without.expected is None and with_it.expected is not None
    expected, fixed = with_it.expected, on.fixed
    np.testing.assert_array_equal(expected[fixed].numpy(), on.x_init[fixed].float().numpy())
    drawn = expected[~fixed]
    assert (drawn >= 0).all() and (drawn <= BINS - 1).all() and len(torch.unique(drawn)) > 10


def test_it_averages_to_the_draws_mean_with_less_variance() -> None:
    """400 draws of one cell (rows on streams 0..399): per gene, the expected counts average to
    the mean of the counts (both estimate the model's conditional mean), and vary less."""
    n = 400
    x, fixed = given_tokens(1, GENES, LOADED.graph.dim - 1)
    draws = job(n, steps=4, seed=1, x_init=x.repeat(n, 1), fixed=fixed.repeat(n, 1),
                expected=True)  # fmt: skip
    engine = Engine.for_model(LOADED, FP32, max_rows_per_forward=128)
    tokens, expected = run_job(engine, draws)
    hidden = ~fixed[0]
    counts, means = tokens[:, hidden].double(), expected[:, hidden].double()  # type: ignore[index]
    error = (means.mean(0) - counts.mean(0)).abs()
    assert (error <= 4 * counts.std(0) / n**0.5 + 1e-9).all(), error
    assert means.var(0).sum() < 0.8 * counts.var(0).sum()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("expected") / "tiny")


@pytest.fixture(scope="module")
def model(model_dir: Path) -> sedd.Model:
    return sedd.load(model_dir, device=str(DEVICE), precision="fp32")


def given() -> anndata.AnnData:
    names = pd.DataFrame(index=["cellA", "cellB", "cellC"])
    return anndata.AnnData(X=COUNTS.copy(), obs=names, var=pd.DataFrame(index=GIVEN_GENES))


def test_api_layer_averages_each_draws_expected_counts_and_keeps_the_cells(
    model: sedd.Model,
) -> None:
    off = model.impute(given(), steps=4, seed=2, n_samples=3)
    on = model.impute(given(), steps=4, seed=2, n_samples=3, expected=True, batch_size=2)
    np.testing.assert_array_equal(dense(on.X), dense(off.X))
    np.testing.assert_array_equal(dense(on.layers[MEAN_LAYER]), dense(off.layers[MEAN_LAYER]))
    assert list(off.layers) == [MEAN_LAYER] and list(on.obs_names) == list(off.obs_names)
    layer = dense(on.layers[EXPECTED_LAYER])
    assert layer.dtype == np.float32 and layer.shape == (3, 12)
    # draw j of the cells, alone on the engine: the layer is the float64 mean of the three
    request = GenerationRequest(3, ("ctrl",), None, SamplingOptions(steps=4, seed=2),
                                imputation=imputation_from_anndata(model.loaded, given()),
                                n_samples=3, expected=True)  # fmt: skip
    planned = plan(model.loaded, request)
    engine = Engine.for_model(model.loaded, model.policy)
    per_draw = [run_job(engine, planned.job(draw=j))[1].numpy() for j in range(3)]  # type: ignore[union-attr]
    want = (np.sum(per_draw, axis=0, dtype=np.float64) / 3).astype(np.float32)
    np.testing.assert_array_equal(layer, want)
    assert len({d.tobytes() for d in per_draw}) == 3
    given_at = [model.genes.index(g) for g in GIVEN_GENES]
    np.testing.assert_array_equal(layer[:, given_at], COUNTS.astype(np.float32))
    # provenance: the layer and the request, and the same run id (cell names) either way
    assert on.uns["sedd"]["expected_layer"] == EXPECTED_LAYER
    assert on.uns["sedd"]["request"]["expected"] is True
    assert "expected" not in off.uns["sedd"]["request"] and "expected_layer" not in off.uns["sedd"]
    generated = GenerationRequest(2, ("KRAS",), None, SamplingOptions(steps=2))
    with_it = GenerationRequest(2, ("KRAS",), None, SamplingOptions(steps=2), expected=True)
    assert run_id(model.loaded, generated) == run_id(model.loaded, with_it)


def test_one_draw_gives_the_layer_alone(model: sedd.Model) -> None:
    one = model.impute(given(), steps=3, seed=4, expected=True)
    assert list(one.layers) == [EXPECTED_LAYER] and "n_samples" not in one.uns["sedd"]
    np.testing.assert_array_equal(dense(one.X), dense(model.impute(given(), steps=3, seed=4).X))


async def test_cli_and_http_give_the_api_layer(
    model: sedd.Model, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = model.impute(given(), steps=4, seed=2, condition="MYC", n_samples=2, expected=True)
    path = tmp_path / "given.h5ad"
    given().write_h5ad(path)
    out = tmp_path / "imputed.h5ad"
    argv = [
        "impute", str(path), "--model", str(model_dir), "--condition", "MYC", "--steps", "4",
        "--seed", "2", "--precision", "fp32", "--device", str(DEVICE), "--out", str(out),
        "--n-samples", "2", "--expected", "--batch-size", "2",
    ]  # fmt: skip
    assert sedd_main(argv) == 0
    capsys.readouterr()
    from_cli = anndata.read_h5ad(out)
    np.testing.assert_array_equal(dense(from_cli.X), dense(api.X))
    for name in (MEAN_LAYER, EXPECTED_LAYER):
        np.testing.assert_array_equal(dense(from_cli.layers[name]), dense(api.layers[name]))
    assert from_cli.layers[EXPECTED_LAYER].dtype == np.float32
    assert from_cli.uns["sedd"]["expected_layer"] == EXPECTED_LAYER

    body = {"genes": GIVEN_GENES, "counts": COUNTS.tolist(), "steps": 4, "seed": 2}
    body |= {"condition": "MYC", "n_samples": 2, "expected": True}
    async with served(make_settings(model_dir)) as (client, _):
        answer = await client.post("/impute", json=body)
        h5ad = await client.post("/impute", json={**body, "format": "h5ad"})
        plain = await client.post("/impute", json={**body, "expected": False})
        streamed = await client.post("/impute/stream", json=body)
        openapi = (await client.get("/openapi.json")).json()
    assert answer.status_code == 200, answer.text
    layer = np.array(answer.json()["expected_counts"], dtype=np.float32)
    np.testing.assert_array_equal(layer, dense(api.layers[EXPECTED_LAYER]))
    np.testing.assert_array_equal(np.array(answer.json()["counts"]), dense(api.X))
    from_http = anndata.read_h5ad(io.BytesIO(h5ad.content))
    np.testing.assert_array_equal(dense(from_http.layers[EXPECTED_LAYER]), layer)
    assert from_http.uns["sedd"]["expected_layer"] == EXPECTED_LAYER
    assert "expected_counts" not in plain.json() and "mean_of_draws" in plain.json()
    assert plain.json()["counts"] == answer.json()["counts"]
    last = streamed.text.strip().split("\n\n")[-1].split("\n")
    assert last[0] == "event: result"
    assert (
        json.loads(last[1].removeprefix("data: "))["expected_counts"]
        == answer.json()["expected_counts"]
    )
    schemas = openapi["components"]["schemas"]
    assert schemas["ImputeRequest"]["properties"]["expected"]["type"] == "boolean"
    assert "expected_counts" in schemas["ImputeResponse"]["properties"]


async def test_each_door_refuses_a_non_bool_naming_the_field(
    model: sedd.Model, model_dir: Path
) -> None:
    with pytest.raises(ValueError, match=r"^`expected` must be True or False, got 'yes'\.$"):
        model.impute(given(), steps=2, expected="yes")  # type: ignore[arg-type]
    body = {"genes": GIVEN_GENES, "counts": COUNTS.tolist(), "steps": 2}
    async with served(make_settings(model_dir)) as (client, _):
        for bad in ("true", 1):
            answer = await client.post("/impute", json={**body, "expected": bad})
            assert answer.status_code == 422, answer.text
            assert answer.json()["detail"][0]["loc"] == ["body", "expected"]


def test_refused_where_it_cannot_be_given(model: sedd.Model, tmp_path: Path) -> None:
    uniform = graph_from_config({"type": "uniform", "dim": BINS + 1})
    score = FixedModel(torch.zeros(GENES, BINS + 1), "score")
    score.mask_index = None  # the uniform graph has no mask
    sampler = Sampler(score, LOADED.noise, uniform, precision=FP32)
    engine = Engine(sampler, ModelLimits(num_genes=GENES, num_perturbations=0))
    with pytest.raises(ValueError, match=r"^`expected` True needs a model on the absorbing"):
        engine.submit(EngineJob(2, expected=True))
    argmax = Sampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32, denoise="argmax")
    engine = Engine(argmax, ModelLimits.of_model(LOADED))
    with pytest.raises(ValueError, match=r"got denoise 'argmax': build the Sampler with denoise"):
        engine.submit(imputed_job(2, expected=True))
    imputation = imputation_from_anndata(model.loaded, given())
    request = GenerationRequest(3, ("ctrl",), None, SamplingOptions(steps=2), expected=True,
                                imputation=imputation)  # fmt: skip
    with pytest.raises(ValueError, match="`expected` must be off for a sharded run, got True"):
        prepare_shard(plan(model.loaded, request), model.policy, tmp_path, Shard(0, 1),
                      EngineSettings())  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@needs_cuda
def test_a_step_with_expected_counts_never_syncs_with_the_host() -> None:
    x, fixed = given_tokens(6, GENES, LOADED.graph.dim - 1)
    rows = StepRows.of_request(
        x.to(DEVICE), 0.8, 0.0, seed=4, temperature=0.7, fixed=fixed.to(DEVICE),
        labels=torch.ones(6, dtype=torch.long, device=DEVICE),
        cell_types=torch.zeros(6, dtype=torch.long, device=DEVICE),
        expected=torch.zeros(6, GENES, device=DEVICE),
    )  # fmt: skip
    branches = StepBranches(any_final=True, kinds=frozenset(), any_tempered=True)
    for graphs in (False, True):
        step = Sampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32, block_rows=4,
                       cuda_graphs=graphs)  # fmt: skip
        step.propose(rows, branches)  # warm-up (and capture) outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            proposal = step.propose(rows, branches)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert proposal.expected is not None and proposal.expected.shape == x.shape


def test_a_tick_with_expected_counts_makes_one_sync(emulator, model: sedd.Model) -> None:
    cpu = sedd.load(model.loaded.path, device="cpu", precision="fp32")
    want = cpu.impute(given(), steps=4, seed=2, expected=True)
    per_tick: list[int] = []
    step = Stepper.step

    def counted(self: Stepper, blocks: list) -> None:
        before = len([s for s in emulator.syncs if s.kind != "capture"])
        step(self, blocks)
        per_tick.append(len([s for s in emulator.syncs if s.kind != "capture"]) - before)

    Stepper.step = counted  # type: ignore[method-assign]
    try:
        got = model.impute(given(), steps=4, seed=2, expected=True)
    finally:
        Stepper.step = step  # type: ignore[method-assign]
    assert len(per_tick) >= 4 and max(per_tick) <= 1, per_tick
    np.testing.assert_array_equal(dense(got.X), dense(want.X))
    np.testing.assert_array_equal(dense(got.layers[EXPECTED_LAYER]),
                                  dense(want.layers[EXPECTED_LAYER]))  # fmt: skip
