"""st3 command lines (``scripts/inference_*.py``) keep working, with gene names and sedd outputs."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from sedd.cli import main
from sedd.commands.st3_scripts import (
    inference_conditional,
    inference_generation,
    inference_perturbseq,
)
from sedd.precision import cpu_has_native_bf16

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")

ROOT = Path(__file__).resolve().parents[2]
ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"
BUNDLED = ROOT / "models" / "pbmc_default"


def _experiment(name: str, tmp_path: Path) -> Path:
    """A writable copy of an st3 fixture experiment (the fixtures are read-only)."""
    dst = tmp_path / "experiments" / name
    dst.mkdir(parents=True)
    for path in (ST3 / name).iterdir():
        shutil.copyfile(path, dst / path.name)
    return dst


def _reference(tmp_path: Path, genes: list[str], labels: list[str], per_label: int) -> Path:
    """Poisson counts, ``per_label`` test and train cells per label."""
    rng = np.random.default_rng(0)
    n = 2 * per_label * len(labels)
    obs = pd.DataFrame(
        {
            "perturbation": [label for label in labels for _ in range(2 * per_label)],
            "split": ["test", "train"] * (n // 2),
        },
        index=[f"real_{i}" for i in range(n)],
    )
    counts = rng.poisson(1.0, size=(n, len(genes))).astype(np.int64)
    adata = anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=genes))
    path = tmp_path / "reference.h5ad"
    adata.write_h5ad(path)
    return path


def test_conditional_script_takes_st3_flags_and_writes_where_st3_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    perts = tmp_path / "perts.txt"
    perts.write_text("GENE_B\nGENE_A\n")
    argv = [
        "--experiment_dir", str(exp), "--checkpoint", "final.pt", "--perturbations_file",
        str(perts), "--num_samples_per_pert", "1", "--num_steps", "2", "--temperature", "0.9",
        "--seed", "3", "--batch_size", "2",
    ]  # fmt: skip
    # st3's bf16 default warns where the CPU emulates bf16 (pyproject's filter hides it from
    # stderr under pytest, so the warning itself is what is checked)
    warned = (
        contextlib.nullcontext()
        if cpu_has_native_bf16()
        else pytest.warns(UserWarning, match="no native bf16")
    )
    with warned:
        assert inference_conditional(argv) == 0
    out = exp / "inference_results" / "generated_cells.h5ad"
    adata = anndata.read_h5ad(out)
    # st3's: exactly the perturbations listed, in their order (no control cells unless listed)
    assert list(adata.obs["perturbation"]) == ["GENE_B", "GENE_A"]
    assert list(adata.obs["condition_idx"]) == [2, 1]
    assert adata.n_vars == 64
    record = adata.uns["sedd"]
    assert record["steps"] == 2 and record["seed"] == 3 and record["temperature"] == 0.9
    assert record["precision"]["amp_dtype"] == "bf16"  # st3's default
    metadata = json.loads((out.parent / "generation_metadata.json").read_text())
    assert metadata["num_cells"] == 2 and metadata["args"]["precision"] == "bf16"


def test_generation_script_names_genes_from_reference_data(tmp_path: Path) -> None:
    exp = _experiment("tiny_mlm", tmp_path)
    genes = [f"REF{i}" for i in range(64)]
    reference = _reference(tmp_path, genes, ["x"], per_label=1)
    argv = [
        "--experiment_dir", str(exp), "--reference_data", str(reference), "--num_generate", "3",
        "--num_steps", "2", "--keep_sparse", "--precision", "fp32",
    ]  # fmt: skip
    assert inference_generation(argv) == 0
    adata = anndata.read_h5ad(exp / "inference" / "generated_cells.h5ad")
    assert adata.n_obs == 3 and list(adata.var_names) == genes
    assert (exp / "inference" / "generation_metadata.json").exists()


def test_perturbseq_script_evaluates_against_held_out_test_cells(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    genes = [str(i) for i in range(64)]  # the st3 model's positional gene names
    reference = _reference(tmp_path, genes, ["non-targeting", "GENE_A", "GENE_Z"], per_label=6)
    argv = [
        "--experiment_dir", str(exp), "--reference_data", str(reference),
        "--num_samples_per_pert", "6", "--num_steps", "2", "--precision", "fp32", "--n_pcs", "5",
    ]  # fmt: skip
    assert inference_perturbseq(argv) == 0
    out_dir = exp / "perturbseq_inference_results"  # st3's place
    adata = anndata.read_h5ad(out_dir / "generated_cells.h5ad")
    # GENE_Z is not a model label: only the shared ones are predicted
    assert sorted(set(adata.obs["perturbation"])) == ["GENE_A", "non-targeting"]
    metrics = json.loads((out_dir / "distribution_metrics.json").read_text())
    assert metrics["scale"]["input"] == "counts"
    assert metrics["reference"]["cells"] == 18 and metrics["reference"]["split"]["value"] == "test"
    assert metrics["overall"]["n_real"] == 12 and metrics["overall"]["n_gen"] == 12
    assert set(metrics["per_condition"]) == {"GENE_A", "GENE_Z", "non-targeting"}
    assert metrics["per_condition"]["GENE_A"]["mmd2_rbf"] is not None


def test_conditional_script_shards_merge_to_the_one_file_result(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    base = [
        "--experiment_dir", str(exp), "--num_samples_per_pert", "1", "--num_steps", "2",
        "--precision", "fp32",
    ]  # fmt: skip
    assert inference_conditional([*base, "--output_dir", str(tmp_path / "one")]) == 0
    for k in ("0", "1"):
        shard = ["--num_shards", "2", "--shard_index", k, "--output_dir", str(tmp_path / "d")]
        assert inference_conditional([*base, *shard]) == 0
    assert main(["merge", str(tmp_path / "d"), "--out", str(tmp_path / "m.h5ad")]) == 0
    one = anndata.read_h5ad(tmp_path / "one" / "generated_cells.h5ad")
    merged = anndata.read_h5ad(tmp_path / "m.h5ad")
    assert np.array_equal(_dense(one), _dense(merged))
    assert one.obs.astype(str).equals(merged.obs.astype(str))


def _dense(adata: anndata.AnnData) -> np.ndarray:
    return adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)


@pytest.mark.slow
def test_script_file_reports_user_errors_in_one_line(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    perts = tmp_path / "perts.txt"
    perts.write_text("GENE_Q\n")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "inference_conditional.py"), "--experiment_dir",
         str(exp), "--perturbations_file", str(perts), "--precision", "fp32"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "inference_conditional.py: error: unknown perturbation 'GENE_Q'" in run.stderr


@pytest.mark.skipif(not (BUNDLED / "config.json").exists(), reason="bundled model missing")
def test_perturbseq_smoke_on_bundled_pbmc_model(tmp_path: Path) -> None:
    argv = [
        "--experiment_dir", str(BUNDLED),
        "--reference_data", str(ROOT / "data" / "pbmc68k_counts.h5ad"),
        "--num_steps", "2", "--num_samples_per_pert", "1", "--precision", "fp32",
        "--output_dir", str(tmp_path),
    ]  # fmt: skip
    assert inference_perturbseq(argv) == 0
    adata = anndata.read_h5ad(tmp_path / "generated_cells.h5ad")
    assert adata.n_obs == 10 and adata.var_names[0] == "HES4"
    metrics = json.loads((tmp_path / "distribution_metrics.json").read_text())
    assert metrics["reference"]["condition_key"] == "bulk_labels"
    assert metrics["reference"]["cells"] == 105
