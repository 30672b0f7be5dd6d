"""The GPU check and the CUDA lane refuse to run without CUDA, in one line; ``sedd bench
--overhead`` prints its table and writes the figures ``scripts/gpu_report.py`` folds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sedd.cli import main

ROOT = Path(__file__).resolve().parent.parent
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")


@no_cuda
def test_gpu_check_stops_in_one_line_without_cuda(tmp_path: Path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no CUDA device" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


@no_cuda
def test_the_cuda_lane_stops_in_one_line_without_cuda():
    env = {**os.environ, "SEDD_TEST_DEVICE": "cuda"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/models/test_layers.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 4
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "SEDD_TEST_DEVICE=cuda, but torch sees no CUDA device" in lines[0]


def test_bench_overhead_prints_the_table_and_writes_the_figures(tmp_path: Path, capsys):
    out = tmp_path / "overhead.json"
    code = main(["bench", "--overhead", "--rows", "1", "8", "--ticks", "1", "--device", "cpu",
                 "--precision", "fp32", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "host ms outside forward" in printed and "syncs" in printed
    result = json.loads(out.read_text())
    figures = {f["rows"]: f for f in result["figures"]}
    assert sorted(figures) == [1, 8]
    assert all(
        f["syncs"] == 1 and f["host_ms"] > 0 and f["forward_ms"] > 0 for f in figures.values()
    )
    ops = [figures[rows]["aten_ops"] for rows in (1, 8)]  # one block of 8 rows either way
    assert abs(ops[0] - ops[1]) <= 0.05 * ops[1]  # padding 1 row to 8 takes a few gathers

    folder = tmp_path / "gpu"
    folder.mkdir()
    (folder / "overhead_small_no-cuda-graphs.json").write_text(out.read_text())
    (folder / "cuda_lane.log").write_text("....\n3 passed in 1.0s\n")
    report = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(folder)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert report.returncode == 0, report.stderr
    md = (folder / "report.md").read_text()
    assert "| rows in flight | host ms |" in md and "3 passed in 1.0s" in md
    assert json.loads((folder / "report.json").read_text())["failed_steps"] == []
