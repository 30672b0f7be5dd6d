"""The bash job scripts (what the sbatch files run) take a gene file, and warn loudly without one
on an st3 model, whose genes are then positions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import anndata as ad
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_MLM = ROOT / "tests" / "data" / "st3" / "experiments" / "tiny_mlm"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run_generation(out_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
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
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "inf_generation.sh")],
        env=clean, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip


def test_genes_file_names_the_genes_of_an_st3_model(tmp_path: Path) -> None:
    genes = [f"GENE{i}" for i in range(64)]
    (tmp_path / "genes.txt").write_text("\n".join(genes) + "\n")
    done = _run_generation(tmp_path / "named", GENES_FILE=str(tmp_path / "genes.txt"))
    assert "GENES ARE POSITIONAL" not in done.stderr
    adata = ad.read_h5ad(tmp_path / "named" / "generated_cells.h5ad")
    assert list(adata.var_names) == genes
    assert adata.uns["sedd"]["genes_by_position"] is False


def test_without_a_genes_file_the_positional_genes_are_a_loud_warning(tmp_path: Path) -> None:
    done = _run_generation(tmp_path / "positional")
    assert "GENES ARE POSITIONAL" in done.stderr and "GENES_FILE=FILE" in done.stderr
    adata = ad.read_h5ad(tmp_path / "positional" / "generated_cells.h5ad")
    assert list(adata.var_names[:3]) == ["0", "1", "2"]
    assert adata.uns["sedd"]["genes_by_position"] is True
