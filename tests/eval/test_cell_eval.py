"""Arc Institute's ``cell-eval run`` accepts our conditional output (``pip install .[eval]``).

Generated cells per label plus control cells (the control label's own generated cells), gene
names as var_names and a perturbation column, against the held-out PBMC cells with the same
columns. Skipped when cell-eval is not installed; CI installs it in a separate step.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from engine_models import request_of

from sedd.checkpoints import load_checkpoint
from sedd.defaults import DEFAULT_MODEL
from sedd.io.read import read_counts
from sedd.io.write import write_cells_h5ad
from sedd.precision import resolve_precision
from sedd.request.plan import GenerationRequest, plan
from sedd.run import GenerationResult, run_plan


def generate(loaded, request: GenerationRequest, precision) -> GenerationResult:
    """The request alone, offline: the library's one plan, run on an in-process engine."""
    return run_plan(plan(loaded, request), precision)


pytest.importorskip("cell_eval")
pytestmark = pytest.mark.celleval

DATA = Path(__file__).resolve().parents[2] / "data" / "pbmc68k_counts.h5ad"


def test_conditional_output_is_accepted_by_cell_eval(tmp_path):
    loaded = load_checkpoint(DEFAULT_MODEL)
    control = loaded.config.control_label
    assert control is not None
    labels = tuple(loaded.config.perturbations)
    request = request_of(cells_per_condition=8, conditions=labels, steps=8, seed=0)
    result = generate(loaded, request, resolve_precision("fp32", "cpu"))
    pred = write_cells_h5ad(
        tmp_path / "pred.h5ad",
        result.counts,
        result.genes,
        result.obs,  # as written: bulk_labels, condition, seed, cell_index, ...
        {},
        count_dtype="float32",
    )
    real = read_counts(DATA)[:, list(loaded.config.genes)]
    real = real[real.obs["split"] == "test"]
    obs = pd.DataFrame(
        {"bulk_labels": real.obs["bulk_labels"].astype(str).to_numpy()}, index=real.obs_names
    )
    real_path = write_cells_h5ad(
        tmp_path / "real.h5ad", real.X, result.genes, obs, {}, count_dtype="float32"
    )
    exe = Path(sys.executable).with_name("cell-eval")
    cmd = [
        str(exe) if exe.exists() else shutil.which("cell-eval") or "cell-eval",
        "run",
        "-ap",
        str(pred),
        "-ar",
        str(real_path),
        "--control-pert",
        control,
        "--pert-col",
        "bulk_labels",  # the model's training key, as the generated file has it
        "--profile",
        "minimal",
        "--num-threads",
        "2",
        "--allow-discrete",
        "-o",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = list((tmp_path / "out").rglob("*results*.csv"))
    assert results, f"no results csv in {list((tmp_path / 'out').rglob('*'))}"
    table = pd.read_csv(results[0])
    assert len(table) > 0
