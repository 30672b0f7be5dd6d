"""The GPU check and the CUDA lane refuse to run without CUDA, in one line; ``sedd bench
--overhead`` prints its table and writes the figures ``scripts/gpu_report.py`` folds; the report
names the lane's failed tests and folds the cell comparison (``scripts/gpu_compare_cells.py``,
which finds CPU cells identical to CPU cells); ``gpu_check.sh`` installs what it lacks, keeps
within 10 minutes of budgets and runs the steps ``--only``/``--skip`` pick."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sedd.cli import main

ROOT = Path(__file__).resolve().parent.parent
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")


@pytest.mark.slow
@no_cuda
def test_gpu_check_stops_in_one_line_without_cuda(tmp_path: Path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no CUDA device" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.slow
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


def _script(name: str):
    """A module of scripts/ (not a package), imported from its file."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _report(folder: Path) -> tuple[int, str, dict]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_report.py"), str(folder)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    md = (folder / "report.md").read_text()
    return done.returncode, md, json.loads((folder / "report.json").read_text())


LANE_LOG = """\
........F..s.E.                                                          [100%]
=================================== FAILURES ===================================
___________________________ test_cells_on_cuda ___________________________
E   AssertionError: cells differ
=========================== short test summary info ============================
\x1b[31mFAILED\x1b[0m tests/engine/test_lane.py::test_cells[True] - AssertionError: cells differ
FAILED tests/test_api.py::test_device_name
ERROR tests/server/test_server.py::test_metrics - RuntimeError: CUDA error: out of memory
2 failed, 11 passed, 1 skipped, 1 error in 12.34s
"""


def test_the_report_names_the_failed_tests_and_steps(tmp_path: Path):
    (tmp_path / "cuda_lane.log").write_text(LANE_LOG)
    (tmp_path / "cuda_lane.status").write_text("failed 1 13 200 cuda\n")
    (tmp_path / "bench_compare.log").write_text("running\nsedd bench: error: it broke\n")
    (tmp_path / "bench_compare.status").write_text("failed 1 4 100 cuda\n")
    (tmp_path / "compare_cells.status").write_text("ok 0 9 60 cuda\n")
    code, md, report = _report(tmp_path)
    assert code == 1
    assert md.splitlines()[0].startswith("# GPU check on") and "EMULATED" not in md
    lane = report["cuda_lane"]
    assert lane["summary"] == "2 failed, 11 passed, 1 skipped, 1 error in 12.34s"
    assert [(f["kind"], f["test"]) for f in lane["failed_tests"]] == [
        ("failed", "tests/engine/test_lane.py::test_cells[True]"),
        ("failed", "tests/test_api.py::test_device_name"),
        ("error", "tests/server/test_server.py::test_metrics"),
    ]
    assert lane["failed_tests"][0]["message"] == "AssertionError: cells differ"
    assert "- `tests/test_api.py::test_device_name`" in md
    assert "failed tests (3):" in md and not lane["interrupted"]
    assert report["failed_steps"] == ["cuda_lane", "bench_compare"]
    assert report["failed_step_errors"]["bench_compare"] == "sedd bench: error: it broke"
    assert report["steps"]["compare_cells"] == {
        "status": "ok", "exit": 0, "seconds": 9, "budget_s": 60, "mode": "cuda"
    }  # fmt: skip


def test_a_lane_stopped_at_its_budget_still_names_its_failures(tmp_path: Path):
    log = LANE_LOG.replace("2 failed, 11 passed", "!!! KeyboardInterrupt !!!\n2 failed, 9 passed")
    lane = _script("gpu_report").parse_lane_log(log)
    assert lane["interrupted"] and len(lane["failed_tests"]) == 3
    assert lane["summary"].startswith("2 failed, 9 passed")

    (tmp_path / "cuda_lane.log").write_text("")  # stopped while pytest started
    (tmp_path / "cuda_lane.status").write_text("timeout 124 201 200 cuda\n")
    code, md, report = _report(tmp_path)
    assert code == 1 and report["cuda_lane"]["interrupted"]
    assert "Stopped at its time budget" in md and "none among those that ran" in md
    assert "- cuda_lane (timeout, exit 124 after 201 s; cuda_lane.log): (no output)" in md


def test_the_report_folds_the_cell_comparison_identical_and_differing(tmp_path: Path):
    compare = _script("gpu_compare_cells").compare_counts
    cells = np.arange(12).reshape(3, 4)
    changed = cells.copy()
    changed[1, 2] += 1
    changed[2, 0] += 1
    genes, names, conditions = ["A", "B", "C", "D"], ["c0", "c1", "c2"], ["x", "y", "y"]
    assert compare(cells, cells.copy(), genes, names, conditions) == {"identical": True}
    differing = compare(cells, changed, genes, names, conditions)
    assert differing == {
        "identical": False, "first_cell": 1, "first_gene_index": 2, "first_gene": "C",
        "count_a": 6, "count_b": 7, "cells_differing": 2, "values_differing": 2, "cells": 3,
        "first_cell_name": "c1", "first_cell_condition": "y",
    }  # fmt: skip
    assert compare(cells, cells[:2], genes)["identical"] is False

    arm = {"cells": 3, "seconds": 0.5, "graph_replays": 0, "cuda_graphs": False}
    result = {
        "request": {"cells_per_condition": 1, "conditions": ["x", "y", "z"], "steps": 3,
                    "seed": 0, "rows_per_forward": 2, "model": "bundled"},
        "arms": {"cpu": {**arm, "device": "cpu"}, "cuda": {**arm, "device": "cuda:0"},
                 "cuda+graphs": {**arm, "device": "cuda:0", "cuda_graphs": True,
                                 "graph_replays": 3}},
        "comparisons": [{"a": "cpu", "b": "cuda", **differing},
                        {"a": "cuda", "b": "cuda+graphs", "identical": True}],
        "identical": False, "graphs_not_replayed": [],
    }  # fmt: skip
    (tmp_path / "compare_cells.json").write_text(json.dumps(result))
    (tmp_path / "compare_cells.status").write_text("ok 0 9 60 emulated\n")
    code, md, report = _report(tmp_path)
    assert code == 0 and report["emulated"] and report["failed_steps"] == []
    assert "EMULATED RUN" in md.splitlines()[0] and "timings mean nothing" in md.splitlines()[0]
    assert "| cuda | cuda+graphs | identical |" in md
    assert "| cpu | cuda | differ: first at cell 1 (y), gene C (#2): 6 vs 7; 2 of 3 cells" in md
    assert report["compare_cells"]["comparisons"][0]["first_gene"] == "C"


def test_compare_cells_on_the_cpu_against_the_cpu_is_identical(tmp_path: Path):
    out = tmp_path / "cells.json"
    code = _script("gpu_compare_cells").main(
        ["--arms", "cpu", "cpu", "--num-conditions", "2", "--cells", "1", "--steps", "2",
         "--rows-per-forward", "1", "--require-identical", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["identical"] is True
    assert result["comparisons"] == [{"a": "cpu", "b": "cpu#1", "identical": True}]
    assert result["request"]["precision"] == "fp32" and len(result["request"]["conditions"]) == 2
    assert all(arm["cells"] == 2 for arm in result["arms"].values())


def _gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/gpu_check.sh ARGS with ENV added (and the session's SEDD_EMULATE_CUDA left out)."""
    base = {k: v for k, v in os.environ.items() if k != "SEDD_EMULATE_CUDA"}
    command = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args]
    return subprocess.run(command, env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_gpu_check_lists_and_picks_its_steps():
    def listed(*args: str) -> list[str]:
        done = _gpu_check("--list", *args)
        assert done.returncode == 0, done.stderr
        return [line.split()[0] for line in done.stdout.splitlines()]

    every = listed()
    assert every[:2] == ["cuda_lane", "compare_cells"] and every[-1] == "total"
    assert "bench_k562_shape" in every and "emulated_heldout" not in every
    total = _gpu_check("--list").stdout.splitlines()[-1].split()
    assert int(total[1]) <= 600  # the budgets: within 10 minutes
    assert listed("--only", "overhead_*,bench_k562_shape") == [
        "bench_k562_shape", "overhead_small_no-cuda-graphs", "overhead_small_cuda-graphs",
        "overhead_bundled_no-cuda-graphs", "overhead_bundled_cuda-graphs", "total",
    ]  # fmt: skip
    assert listed("--emulated", "--only", "bench_compare") == [
        "emulated_heldout",
        "bench_compare",
        "total",
    ]  # the emulated compare's held-out cells come with it
    assert "cuda_lane" not in listed("--skip", "cuda_lane")


def test_gpu_check_installs_what_it_needs_first(tmp_path: Path):
    # a python that lacks pytest and records what pip is asked to do
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'if [[ $1 == -m && $2 == pip ]]; then echo "$@" > {tmp_path}/pip.txt; exit 0; fi\n'
        'if [[ $2 == *find_spec* ]]; then echo pytest; fi\n'
        "exit 0\n"
    )  # fmt: skip
    fake.chmod(0o755)
    done = _gpu_check("--emulated", "--only", "no_such_step", PYTHON=str(fake),
                      OUT=str(tmp_path / "out"))  # fmt: skip
    assert "lacks pytest: installing what it needs" in done.stdout
    assert (tmp_path / "pip.txt").read_text().split() == [
        "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"
    ]  # fmt: skip
    assert done.returncode == 2 and "left no step to run" in done.stderr


def test_the_lane_is_one_derived_list_every_runner_takes() -> None:
    """tests/batch became tests/shards and gpu_check's own list, kept by hand, collected nothing
    (pytest exits 4 before any test) while CI ran another list. Now scripts/lane_tests.py derives
    the one list: every folder and top-level module of tests/ is in the lane or excluded with a
    reason, every path exists, and no runner keeps a list of its own."""
    lane = _script("lane_tests")
    paths = lane.lane_paths()
    assert lane.problems() == [], lane.problems()
    assert {"tests/engine", "tests/shards", "tests/models", "tests/test_api.py"} <= set(paths)
    entries = {p.relative_to(ROOT).as_posix() for p in lane._entries()}
    assert entries == set(paths) | set(lane.EXCLUDED)  # each one in the lane or excluded
    assert all(len(why.split()) >= 3 for why in lane.EXCLUDED.values())  # a reason, not a word
    missing = [p for p in [*paths, *lane.EXCLUDED] if not (ROOT / p).exists()]
    assert not missing, f"the lane names test paths that do not exist: {missing}"

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lane_tests.py")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == paths
    for runner in ("scripts/gpu_check.sh", ".ci/cuda_lane.sh"):
        lines = (ROOT / runner).read_text().splitlines()
        code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
        assert "scripts/lane_tests.py" in code, runner
        assert not re.search(r"tests/(engine|diffusion|server|request|shards|models)\b", code)
    ci = (ROOT / ".ci" / "gpu_check_emulated.sh").read_text()
    assert "unset LANE_TESTS" in ci and "LANE_TESTS=" not in ci  # gpu_check's real default


def test_an_exclusion_without_a_reason_or_a_path_is_a_problem(monkeypatch) -> None:
    lane = _script("lane_tests")
    monkeypatch.setitem(lane.EXCLUDED, "tests/io", " ")
    monkeypatch.setitem(lane.EXCLUDED, "tests/batch", "renamed long ago")
    assert lane.problems() == [
        "tests/io: excluded without a reason",
        "tests/batch: excluded, but not in tests/",
    ]
    monkeypatch.delitem(lane.EXCLUDED, "tests/train")
    assert "tests/train" in lane.lane_paths()  # a folder nobody excluded joins the lane
