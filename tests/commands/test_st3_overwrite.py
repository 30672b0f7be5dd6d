"""st3's scripts never lose a result: a second run into the same place is refused (nothing
changes on disk) unless ``--overwrite``, and the metadata then describes the new cells."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import anndata
import pytest
from st3_runs import SEDD, job, run

from sedd.cli import main
from sedd.commands.st3_scripts import inference_conditional
from sedd.io.files import sha256_file

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
ROOT = Path(__file__).resolve().parents[2]
ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"


def test_a_second_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    exp = tmp_path / "tiny_pert"
    shutil.copytree(ST3 / "tiny_pert", exp)
    base = [
        "--experiment_dir",
        str(exp),
        "--num_samples_per_pert",
        "1",
        "--num_steps",
        "2",
        "--precision",
        "fp32",
    ]
    assert inference_conditional([*base, "--seed", "1"]) == 0
    out = exp / "inference_results" / "generated_cells.h5ad"
    meta = exp / "inference_results" / "generation_metadata.json"
    first, first_meta = sha256_file(out), meta.read_text()
    with pytest.raises(FileExistsError, match=r"generated_cells.h5ad exists .* --overwrite"):
        inference_conditional([*base, "--seed", "2"])
    assert sha256_file(out) == first and meta.read_text() == first_meta  # nothing lost
    # the script file: one line, exit 2, no traceback
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "inference_conditional.py"), *base, "--seed", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert script.returncode == 2 and "Traceback" not in script.stderr
    assert "inference_conditional.py: error:" in script.stderr and "--overwrite" in script.stderr
    assert sha256_file(out) == first
    assert inference_conditional([*base, "--seed", "2", "--overwrite"]) == 0
    assert sha256_file(out) != first
    assert json.loads(meta.read_text())["request"]["seed"] == 2
    assert set(anndata.read_h5ad(out).obs["seed"]) == {2}


def _job(exp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """st3's job script as a user runs it (without SLURM: every shard, then the merge)."""
    return job("inf_conditional.sh", EXPERIMENT_DIR=str(exp), PRECISION="fp32",
               NUM_SAMPLES_PER_PERT="1", **extra)  # fmt: skip


def _state(out: Path) -> tuple[str, str]:
    return sha256_file(out), (out.parent / "generation_metadata.json").read_text()


def _describes(out: Path) -> None:
    """The metadata and the file tell of one run: cell count, steps and seed agree."""
    meta = json.loads((out.parent / "generation_metadata.json").read_text())
    adata = anndata.read_h5ad(out)
    assert meta["output"] == str(out) and meta["num_cells"] == adata.n_obs
    assert meta["request"]["steps"] == adata.uns["sedd"]["steps"]
    assert meta["request"]["seed"] == adata.uns["sedd"]["seed"]


@pytest.mark.slow
def test_no_sequence_of_scripts_job_scripts_and_sedd_commands_replaces_a_result(
    tmp_path: Path,
) -> None:
    exp = tmp_path / "tiny_pert"
    shutil.copytree(ST3 / "tiny_pert", exp)
    out = exp / "inference_results" / "generated_cells.h5ad"
    script = [
        sys.executable,
        str(ROOT / "scripts" / "inference_conditional.py"),
        "--experiment_dir",
        str(exp),
        "--precision",
        "fp32",
        "--num_samples_per_pert",
        "1",
    ]

    # 1. the st3 script, then the job script (which slurm/inf_cond.sbatch runs): refused
    assert run([*script, "--num_steps", "2"]).returncode == 0
    _describes(out)
    before = _state(out)
    job = _job(exp, NUM_STEPS="3", NUM_SHARDS="2")
    assert job.returncode == 2 and "OVERWRITE=1" in job.stderr, job.stderr[-800:]
    assert _state(out) == before and not (out.parent / "shards").exists()  # before sampling

    # 2. `sedd predict --out` and `sedd merge --out` onto the same file: refused
    predict = run([str(SEDD), "predict", "--model", str(exp), "--steps", "1", "--precision",
                   "fp32", "--out", str(out)])  # fmt: skip
    assert predict.returncode == 2 and "--overwrite" in predict.stderr
    assert _state(out) == before

    # 3. OVERWRITE=1: the job script replaces it, and the metadata describes the new cells
    job = _job(exp, NUM_STEPS="3", NUM_SHARDS="2", OVERWRITE="1", SEED="4")
    assert job.returncode == 0, job.stderr[-800:]
    _describes(out)
    assert anndata.read_h5ad(out).uns["sedd"]["steps"] == 3
    merged = _state(out)

    # 4. then the st3 script, the job script again, and a merge by hand: all refused
    assert run(script).returncode == 2
    assert _job(exp, NUM_STEPS="3", NUM_SHARDS="2", SEED="4").returncode == 2
    sedd_merge = run([str(SEDD), "merge", str(out.parent), "--out", str(out)])
    assert sedd_merge.returncode == 2 and "--overwrite" in sedd_merge.stderr
    assert _state(out) == merged

    # 5. the st3 script with --overwrite: one file, its metadata (the shard run's is gone)
    assert run([*script, "--num_steps", "5", "--overwrite"]).returncode == 0
    _describes(out)
    assert json.loads((out.parent / "generation_metadata.json").read_text()).get("status") is None


def test_sedd_commands_refuse_to_replace_their_output_and_drop_its_old_metrics(
    tmp_path: Path,
) -> None:
    exp = tmp_path / "tiny_mlm"
    shutil.copytree(ST3 / "tiny_mlm", exp)
    out = tmp_path / "cells.h5ad"
    base = [
        "generate",
        "--model",
        str(exp),
        "--num-cells",
        "2",
        "--steps",
        "1",
        "--precision",
        "fp32",
        "--out",
        str(out),
    ]
    assert main([*base, "--seed", "1"]) == 0
    first = sha256_file(out)
    assert main([*base, "--seed", "2"]) == 2 and sha256_file(out) == first
    assert main([*base, "--seed", "2", "--overwrite"]) == 0
    assert json.loads(out.with_suffix(".metrics.json").read_text())["cells"] == 2
    assert set(anndata.read_h5ad(out).obs["seed"]) == {2}
