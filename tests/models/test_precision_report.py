"""`sedd precision-report`: module dtypes under autocast, bf16-vs-fp32 log-score error, speed."""

from __future__ import annotations

import json
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch

from sedd.checkpoints import LoadedModel, load_checkpoint
from sedd.cli import main
from sedd.eval.precision_report import (
    folded_names,
    module_dtypes,
    probe_batch,
    score_error,
)
from sedd.precision import resolve_precision

DATA = Path(__file__).resolve().parents[1] / "data"
TINY_PERT = DATA / "st3" / "experiments" / "tiny_pert"
TINY_ESM_CT = DATA / "st3" / "experiments" / "tiny_pert_ct_esm"
UNIFORM = DATA / "sedd_reference" / "uniform" / "hf"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_checkpoint(TINY_PERT)


def _rows(loaded: LoadedModel, precision: str) -> dict[str, tuple[str, str]]:
    batch = probe_batch(loaded, cells=2, seed=1)
    policy = resolve_precision(precision, "cpu")
    return {
        r.name: (r.param_dtypes, r.output_dtypes)
        for r in module_dtypes(loaded.model, policy, batch)
    }


def test_block_indices_fold_but_sequential_members_stay(tiny: LoadedModel) -> None:
    names = folded_names(tiny.model)
    assert names["blocks.1.attn.qkv"] == "blocks.*.attn.qkv"
    assert names["blocks.0.ff.net.0"] == "blocks.*.ff.net.0"
    assert names["blocks.0.ff.net.3"] == "blocks.*.ff.net.3"
    assert names[""] == "(model)"


def test_bf16_autocast_runs_linears_in_bf16_and_hands_the_sampler_fp32(
    tiny: LoadedModel,
) -> None:
    rows = _rows(tiny, "bf16")
    assert rows["blocks.*.attn.qkv"] == ("float32", "bfloat16")  # fp32 weights, bf16 matmul
    assert rows["out_proj"] == ("float32", "bfloat16")
    assert rows["token_embed"] == ("float32", "float32")  # embeddings are not autocast
    assert rows["blocks.*.attn_norm"][1] == "float32"  # layer_norm autocasts to fp32
    assert rows["(policy output)"][1] == "float32"  # PRECISION.md rule 3


def test_fp32_policy_has_no_reduced_precision_anywhere(tiny: LoadedModel) -> None:
    outputs = {out for _, out in _rows(tiny, "fp32").values()}
    assert outputs <= {"float32", "-"}


def test_fp32_against_fp32_has_zero_error_and_bf16_a_small_nonzero_one(
    tiny: LoadedModel,
) -> None:
    batch = probe_batch(tiny, cells=4, seed=0)
    fp32 = resolve_precision("fp32", "cpu")
    same = score_error(tiny, fp32, resolve_precision("fp32", "cpu"), batch)
    assert same["max_abs"] == 0.0 and same["mean_kl_p0"] == 0.0
    bf16 = score_error(tiny, resolve_precision("bf16", "cpu"), fp32, batch)
    assert 0.0 < bf16["mean_abs"] <= bf16["p99_abs"] <= bf16["max_abs"] < 0.5
    masked = int((batch.x == tiny.config.tokens.mask_index).sum())
    assert bf16["positions"] == masked > 0


def test_score_models_on_uniform_graphs_compare_every_position() -> None:
    loaded = load_checkpoint(UNIFORM)
    batch = probe_batch(loaded, cells=2, seed=0)
    err = score_error(
        loaded, resolve_precision("bf16", "cpu"), resolve_precision("fp32", "cpu"), batch
    )
    assert err["positions"] == batch.x.numel()
    assert "mean_kl_p0" not in err and np.isfinite(err["max_abs"])


def test_vector_labels_and_cell_types_are_drawn_for_conditioned_models() -> None:
    loaded = load_checkpoint(TINY_ESM_CT)
    batch = probe_batch(loaded, cells=3, seed=0)
    assert batch.labels is not None and batch.labels.shape[0] == 3 and batch.labels.ndim == 2
    assert batch.cell_types is not None and batch.cell_types.shape == (3,)


def _write_counts(path: Path, loaded: LoadedModel) -> Path:
    rng = np.random.default_rng(0)
    names = loaded.config.perturbations or []
    counts = rng.poisson(1.0, size=(6, loaded.config.num_genes)).astype(np.int64)
    obs = pd.DataFrame(
        {"pert": [names[i % len(names)] for i in range(6)]}, index=[f"c{i}" for i in range(6)]
    )
    var = pd.DataFrame(index=list(loaded.config.genes))
    anndata.AnnData(counts, obs=obs, var=var).write_h5ad(path)
    return path


def test_data_cells_keep_their_labels_and_a_bad_key_is_named(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    data = _write_counts(tmp_path / "cells.h5ad", tiny)
    batch = probe_batch(tiny, cells=4, data=data, label_key="pert", seed=0)
    assert batch.x.shape == (4, tiny.config.num_genes)
    assert "4 of 6 cells" in batch.source
    names = tiny.config.perturbations or []
    used = {names[i % len(names)] for i in range(6)}  # the obs column of the file
    assert {names[i] for i in batch.labels.tolist()} <= used  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="'nope' is not an obs column"):
        probe_batch(tiny, cells=2, data=data, label_key="nope")


def test_cli_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "report.json"
    rc = main(
        ["precision-report", str(TINY_PERT), "--cells", "2", "--repeats", "1", "--out", str(out)]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "module dtypes under bf16 autocast" in printed and "bf16 / fp32 speed" in printed
    report = json.loads(out.read_text())
    assert report["policy"]["amp_dtype"] == "bf16"
    assert report["speed"]["speed_ratio_vs_fp32"] > 0
    assert report["modules"][-1] == {
        "name": "(policy output)",
        "kind": "PrecisionPolicy.forward",
        "param_dtypes": "-",
        "output_dtypes": "float32",
        "calls": 1,
    }
    assert torch.isfinite(torch.tensor(report["score_error"]["max_abs"]))
