"""``sedd bench --roofline``: one block step's FLOPs, bytes and memory by part, counted on the
emulated CUDA lane's meta backing (no timing, so exact values can be asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from devices import EMULATED

from sedd.bench.roofline import PARTS, Shape, block_step_roofline
from sedd.cli import main

pytestmark = pytest.mark.skipif(EMULATED, reason="runs an emulation of its own (meta backing)")

# sampler-tail bytes of one bf16 block step at the K562 shape (15 rows), counted at 24a7342
# (before the absorbing draw skipped its clamp pass over (rows, genes, vocab))
K562_TAIL_BYTES_BEFORE = 16.697e9


def test_gemm_flops_are_exact_on_a_tiny_model():
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
    assert all(r.bytes[p] > 0 for p in PARTS) and r.peak_bytes > 0


def test_the_k562_sampler_tail_moves_less_than_before():
    r = block_step_roofline(Shape(), "bf16")
    assert r.bytes["sampler tail"] < 0.9 * K562_TAIL_BYTES_BEFORE
    # the step's peak stays under what the block size plans with (sedd.engine.forwards)
    from sedd.engine.forwards import step_bytes

    assert r.peak_bytes < step_bytes(15, 8563, 1725)


def test_the_cli_prints_the_table_and_writes_json(tmp_path: Path, capsys):
    out = tmp_path / "roofline.json"
    assert main(["bench", "--roofline", "--roofline-shape", "64x9:16/1/2:4", "--out",
                 str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "sampler tail" in printed and "peak device memory" in printed
    result = json.loads(out.read_text())["roofline"]
    assert result["shape"]["genes"] == 64 and set(result["parts"]) == set(PARTS)


def test_a_bad_shape_is_one_line_naming_the_option(capsys):
    assert main(["bench", "--roofline", "--roofline-shape", "8563:256"]) == 2
    err = capsys.readouterr().err
    assert "--roofline-shape must be GENESxBINS:HIDDEN/LAYERS/HEADS:ROWS" in err
