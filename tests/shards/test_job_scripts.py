"""The bash job scripts (what the sbatch files run) take a gene file, and warn loudly without one
on an st3 model, whose genes are then positions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anndata as ad
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_MLM = ROOT / "tests" / "data" / "st3" / "experiments" / "tiny_mlm"
GENES = [f"GENE{i}" for i in range(64)]


# st3's job script end to end, in subprocesses: CI's slow step, not the README's command
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
]

Run = tuple[subprocess.Popen[str], Path, Path]  # (the script, its OUTPUT_DIR, its stderr file)


def _start_generation(out_dir: Path, **env: str) -> Run:
    """Start the job script; its stdout and stderr go to files beside ``out_dir``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    clean |= {
        "SEDD": str(Path(sys.executable).with_name("sedd")),
        "EXPERIMENT_DIR": str(TINY_MLM),
        "CHECKPOINT": "final.pt",
        "NUM_GENERATE": "2",
        "NUM_STEPS": "1",
        "PRECISION": "fp32",
        "OUTPUT_DIR": str(out_dir),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    log = out_dir.with_suffix(".log")
    with log.with_suffix(".out").open("w") as out, log.open("w") as err:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "inf_generation.sh")],
            env=clean, stdout=out, stderr=err, text=True,
        )  # fmt: skip
    return proc, out_dir, log


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Both tests' runs of the script, each in its own directory, started at once (one process
    each: they share nothing); a test waits for its own with ``_finished``."""
    root = tmp_path_factory.mktemp("job_scripts")
    (root / "genes.txt").write_text("\n".join(GENES) + "\n")
    started = {
        "named": _start_generation(root / "named", GENES_FILE=str(root / "genes.txt")),
        "positional": _start_generation(root / "positional"),
    }
    yield started
    for proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _finished(run: Run) -> tuple[Path, str]:
    """(output directory, stderr) of ``run``, once the script exited 0."""
    proc, out_dir, log = run
    returncode = proc.wait(timeout=300)
    assert returncode == 0, log.read_text()
    return out_dir, log.read_text()


def test_genes_file_names_the_genes_of_an_st3_model(runs: dict[str, Run]) -> None:
    out_dir, stderr = _finished(runs["named"])
    assert "GENES ARE POSITIONAL" not in stderr
    adata = ad.read_h5ad(out_dir / "generated_cells.h5ad")
    assert list(adata.var_names) == GENES
    assert adata.uns["sedd"]["genes_by_position"] is False


def test_without_a_genes_file_the_positional_genes_are_a_loud_warning(
    runs: dict[str, Run],
) -> None:
    out_dir, stderr = _finished(runs["positional"])
    assert "GENES ARE POSITIONAL" in stderr and "GENES_FILE=FILE" in stderr
    adata = ad.read_h5ad(out_dir / "generated_cells.h5ad")
    assert list(adata.var_names[:3]) == ["0", "1", "2"]
    assert adata.uns["sedd"]["genes_by_position"] is True
