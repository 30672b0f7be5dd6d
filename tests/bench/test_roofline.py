"""``sedd bench --roofline``: one block step's FLOPs, bytes and memory by part, counted on the
emulated CUDA lane's meta backing (no timing, so exact values can be asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from devices import EMULATED

import sedd.commands.roofline as roofline_command
from sedd.bench.roofline import (
    H100_BF16_FLOPS,
    H100_BYTES_PER_S,
    PARTS,
    Roofline,
    Shape,
    block_step_roofline,
    estimated_seconds,
    plan_row,
)
from sedd.cli import main

# slow: an emulation builds its C++ device guard first (tests/cuda_emulation/test_emulator.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(EMULATED, reason="runs an emulation of its own (meta backing)"),
]

# One bf16 block step at the K562 shape (8563 x 1724, 256/8/8, 15 rows), counted by this roofline
# on the sampler as of f2c6d5c (unchanged since 17d05f4): before the absorbing step took softmax
# over whole rows, scaled in place and kept the stay apart.
K562_TAIL_BYTES_BEFORE = 14_971_084_228
K562_PEAK_BYTES_BEFORE = 5_328_575_467


def test_gemm_and_attention_flops_are_exact_on_a_tiny_model():
    shape = Shape(genes=16, bins=5, hidden=8, layers=1, heads=2, rows=3)
    r = block_step_roofline(shape, "fp32")
    tokens, h, rows, vocab = shape.rows * shape.genes, shape.hidden, shape.rows, shape.vocab
    per_layer = 2 * tokens * h * (3 * h + h + 4 * h + 4 * h)  # qkv, out, ff up and down
    conditioning = 2 * rows * h * (4 * h * 2) * 2  # time and perturbation MLPs (H->4H->H)
    ada_ln = 2 * rows * h * 2 * h * (2 * shape.layers + 1)  # [gamma|beta] per norm
    head = 2 * tokens * h * vocab  # out_proj, no bias
    assert r.flops["linear"] == per_layer * shape.layers + conditioning + ada_ln + head
    heads, d = shape.heads, h // shape.heads
    assert r.flops["attention"] == 4 * rows * heads * shape.genes**2 * d  # flash: no L x L
    assert r.flops["elementwise"] == r.flops["sampler tail"] == 0
    assert r.total_flops == sum(r.flops[p] for p in PARTS)
    assert r.total_bytes == sum(r.bytes[p] for p in PARTS)
    assert all(r.bytes[p] > 0 for p in PARTS) and r.peak_bytes > 0
    # q, k, v read and the output written once a layer: (rows, genes, hidden) fp32 each
    assert r.bytes["attention"] == shape.layers * 4 * tokens * h * 4


def test_the_k562_sampler_tail_moves_at_most_half_of_before_and_the_step_peaks_lower():
    r = block_step_roofline(Shape(), "bf16")
    # 7.27 GB: the two-level fp64 draw writes no (rows, genes, vocabulary) fp64 tensor, and the
    # stay and the non-finite check come from the draw's chunk sums
    assert r.bytes["sampler tail"] <= 0.5 * K562_TAIL_BYTES_BEFORE
    assert r.peak_bytes < 0.45 * K562_PEAK_BYTES_BEFORE  # 1.93 GiB
    # the step's peak stays under what the block size plans with (sedd.engine.forwards)
    from sedd.engine.forwards import step_bytes

    assert r.peak_bytes < step_bytes(15, 8563, 1725)


def test_the_plan_takes_each_part_at_its_bound_and_a_forward_per_step_and_the_denoise():
    shape = Shape(genes=100, bins=9, rows=4)
    r = Roofline(shape, "bf16")
    r.flops["attention"] = 0.15 * H100_BF16_FLOPS  # 1 s at 15% MFU
    r.flops["linear"], r.bytes["linear"] = 1.0, 2 * H100_BYTES_PER_S  # memory-bound: 2 s
    r.bytes["sampler tail"] = H100_BYTES_PER_S  # 1 s
    assert estimated_seconds(r, 0.15) == pytest.approx(4.0)
    row = plan_row("toy", r, steps=9)
    assert row["cells_per_s@15%"] == pytest.approx(4 / (10 * 4.0))  # 4 cells a block
    assert row["gpu_hours_per_million@20%"] == pytest.approx(10 * 3.75 / 4 * 1e6 / 3600)


def test_the_cli_prints_the_table_and_writes_json(tmp_path: Path, capsys):
    out = tmp_path / "roofline.json"
    assert main(["bench", "--roofline", "--roofline-shape", "64x9:16/1/2:4", "--out",
                 str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "sampler tail" in printed and "peak device memory" in printed
    result = json.loads(out.read_text())["roofline"]
    assert result["shape"]["genes"] == 64 and set(result["parts"]) == set(PARTS)
    parts = result["parts"].values()
    assert result["total_bytes"] == sum(p["bytes"] for p in parts)


def test_rows_default_to_the_cuda_block_and_the_plan_is_labelled_an_estimate(
    tmp_path: Path, capsys, monkeypatch
):
    assert roofline_command.parse_shape("8563x1724:256/8/8").rows == 15
    monkeypatch.setattr(roofline_command, "SHAPES", {"toy": "64x9:16/1/2", "K562": "8x3:8/1/2"})
    out = tmp_path / "r.json"
    argv = ["bench", "--roofline", "--roofline-shape", "64x9:16/1/2", "--plan", "--out", str(out)]
    assert main(argv) == 0
    assert "ESTIMATE, not measured" in capsys.readouterr().out
    plan = json.loads(out.read_text())["plan_estimate"]
    assert [(row["model"], row["steps"]) for row in plan] == [
        ("toy", 10), ("toy", 50), ("K562", 10), ("K562", 50),
    ]  # fmt: skip
    assert plan[0]["shape"] == "64x9:16/1/2:2048"  # 131,072 tokens // 64 genes


def test_a_bad_shape_is_one_line_naming_the_option(capsys):
    assert main(["bench", "--roofline", "--roofline-shape", "8563:256"]) == 2
    err = capsys.readouterr().err
    assert "--roofline-shape must be GENESxBINS:HIDDEN/LAYERS/HEADS[:ROWS]" in err
