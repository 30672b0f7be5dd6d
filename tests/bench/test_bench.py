"""``sedd bench`` measures fp32 and bf16 side by side and reports consistent ratios."""

from __future__ import annotations

import json
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from server_models import GENES, NUM_BINS, PERTURBATIONS, save_tiny_model
from torch.utils.flop_counter import FlopCounterMode

from sedd.bench.flops import forward_flops
from sedd.cli import main
from sedd.defaults import resolve_schedule
from sedd.eval.quality import FIGURES
from sedd.models.st3 import SEDDTransformer


def test_bench_prints_and_writes_fp32_and_bf16_side_by_side(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--shapes",
            "32/1/2",
            "--num-genes",
            "64",
            "--batch-sizes",
            "2",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--num-bins",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "fp32" in printed and "bf16" in printed and "speedup vs fp32" in printed
    data = json.loads(out.read_text())
    (case,) = data["cases"]
    fp32, bf16 = case["results"]["fp32"], case["results"]["bf16"]
    # 2 steps, which leave no mask for the denoise: it runs no forward and is not counted
    assert fp32["forwards"] == bf16["forwards"] == 2
    # what a cell cost: its 2 forwards, 32 of its 64 genes committed in each
    assert fp32["forwards_per_cell"] == 2 and fp32["genes_per_forward"] == 32
    assert fp32["tokens_per_s"] == pytest.approx(fp32["cells_per_s"] * 64)
    ratio = case["ratios_vs_fp32"]["bf16"]["speedup_cells_per_s"]
    assert ratio == pytest.approx(bf16["cells_per_s"] / fp32["cells_per_s"])
    assert bf16["precision_record"]["amp_dtype"] == "bf16"
    assert fp32["precision_record"]["amp_dtype"] == "fp32"
    parity = case["score_parity_vs_fp32"]["bf16"]
    assert 0 < parity["max_abs"] < 0.1 and parity["mean_abs"] <= parity["max_abs"]


def test_bench_rejects_bad_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--shapes", "128x4x4"])
    assert "HIDDEN/LAYERS/HEADS" in capsys.readouterr().err


def _held_out_file(path: Path, n_test: int = 12, n_train: int = 24) -> Path:
    rng = np.random.default_rng(0)
    n = n_test + n_train
    obs = pd.DataFrame(
        {
            "bulk_labels": [PERTURBATIONS[i % 3] for i in range(n)],
            "split": ["test"] * n_test + ["train"] * n_train,
        },
        index=[f"c{i}" for i in range(n)],
    )
    counts = sp.csr_matrix(rng.poisson(1.0, size=(n, len(GENES))).clip(0, NUM_BINS - 1))
    adata = anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=GENES))
    adata.write_h5ad(path)
    return path


@pytest.mark.slow
def test_compare_runs_st3s_pattern_and_our_default_with_quality_ratio_and_mfu(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "tiny")
    data = _held_out_file(tmp_path / "held_out.h5ad")
    out = tmp_path / "compare.json"
    code = main([
        "bench", "--compare", "--model", str(model), "--data", str(data), "--device", "cpu",
        "--precision", "fp32", "--chunks", "3", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "st3's pattern vs our default" in printed and "MFU" in printed
    result = json.loads(out.read_text())
    st3, ours = result["st3"], result["default"]
    assert (st3["steps"], st3["time_grid"], st3["batch_size"]) == (50, "uniform", 1)
    default = resolve_schedule(None, None)  # the tiny model carries no calibration
    assert (ours["sampler"], ours["steps"], ours["time_grid"]) == (
        default["sampler"], default["steps"], default["time_grid"])  # fmt: skip
    assert result["cells"] == 12 and result["chunks"] == 3
    assert -1.0 <= result["held_out_within_label_agreement"] <= 1.0  # the real one, 12 cells
    # one cell a call in st3's pattern: up to 50 steps and the denoise for each of 12 cells (a
    # cell whose 12 genes are all drawn leaves, and runs no more forwards)
    assert 12 * 12 <= st3["model_calls"] <= 12 * 51
    assert st3["model_calls"] == pytest.approx(12 * st3["forwards_per_cell"])
    assert ours["forwards_per_cell"] <= default["steps"] + 1
    assert result["speedup_cells_per_s"] == pytest.approx(ours["cells_per_s"] / st3["cells_per_s"])
    for arm in (st3, ours):
        assert set(arm["quality"]) == set(FIGURES)
        assert all(np.isfinite(v) for v in arm["quality"].values())
    mfu = result["mfu"]
    assert mfu["fp32"]["mfu_vs_fp32_matmul"] == pytest.approx(
        mfu["fp32"]["flops_per_s"] / mfu["fp32_matmul"]
    )


def test_flop_count_includes_cpu_attention():
    torch.manual_seed(0)
    model = SEDDTransformer(32, 8, 16, 2, 2).eval()
    x, sigma = torch.randint(0, 8, (3, 32)), torch.ones(3)
    with torch.inference_mode(), FlopCounterMode(display=False) as plain:
        model(x, sigma)
    attention = 2 * 3 * 4 * 32 * 32 * 16  # layers x rows x 4 L^2 H
    assert forward_flops(model, x, sigma) == plain.get_total_flops() + attention
