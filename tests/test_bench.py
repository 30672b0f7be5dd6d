"""``sedd bench`` measures fp32 and bf16 side by side and reports consistent ratios."""

from __future__ import annotations

import json

import pytest

from sedd.cli import main


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
