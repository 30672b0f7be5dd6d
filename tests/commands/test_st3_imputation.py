"""st3's ``scripts/inference_imputation.py`` as st3 users run it: its flags and YAML keys, its
files with st3's names, keys and number formats, and scores that the written cells reproduce."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from st3_runs import job

from sedd.commands.st3_flags import flags_for
from sedd.commands.st3_imputation import entry_mask, inference_imputation

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
ROOT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments" / "tiny_mlm"
BUNDLED = ROOT / "models" / "pbmc_default"
ST3_FILES = {"accuracy.txt", "mae.json", "metrics.json", "within_1.csv", "within_3.csv",
             "within_5.csv", "within_10.csv"}  # fmt: skip
CELL_FILES = {f"cell_{i}_{kind}" for i in range(3) for kind in ("acc.txt", "mae.json")}
SEDD_FILES = {"imputed_cells.h5ad", "imputed_cells.generation_metadata.json",
              "imputed_cells.metrics.json"}  # fmt: skip
UPSTREAM_FLAGS = {
    "--config", "--experiment_dir", "--checkpoint", "--data_path", "--val_fraction",
    "--use_train_split", "--mask_ratio", "--num_steps", "--temperature", "--sampler",
    "--batch_size", "--num_batches", "--num_cells_visualize", "--seed", "--num_workers",
}  # fmt: skip


def _experiment(root: Path) -> Path:
    """A writable copy of the st3 fixture: an unconditional model of 64 genes, 20 bins."""
    return Path(shutil.copytree(TINY, root / "experiments" / "tiny_mlm"))


def _cells(path: Path, n_cells: int = 30) -> Path:
    """Counts 0..19 (the model's range) of 64 named genes."""
    rng = np.random.default_rng(0)
    counts = np.minimum(rng.poisson(2.0, size=(n_cells, 64)), 19).astype(np.int64)
    obs = pd.DataFrame(index=[f"cell_{i}" for i in range(n_cells)])
    anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=[f"G{i}" for i in range(64)]))\
        .write_h5ad(path)  # fmt: skip
    return path


def _impute(exp: Path, data: Path, *extra: str) -> Path:
    argv = ["--experiment_dir", str(exp), "--data_path", str(data), "--num_steps", "2", *extra]
    assert inference_imputation(argv) == 0
    return exp / "imputation_results"


def _rnaseq_small(path: Path, data: Path | None, **inference: object) -> Path:
    """st3's configs/rnaseq_small.yaml (its inference, data and other sections as published),
    with ``inference`` changed."""
    body = {
        "model": {"name": "SEDDTransformerSmall", "hidden_dim": 128, "num_layers": 4},
        "data": {"data_path": None if data is None else str(data), "val_fraction": 0.1},
        "training": {"batch_size": 2, "mask_ratio": 0.15},
        "inference": {
            "mask_ratio": 0.2,
            "num_steps": 50,
            "temperature": 1.0,
            "sampler": "euler",
            "batch_size": 32,
            "num_batches": None,
            "num_cells_visualize": 3,
            **inference,
        },
        "other": {"seed": 42, "num_workers": 4},
        "diffusion": {"noise_schedule": "LogLinearNoise", "noise_eps": 1.0e-3},
    }
    path.write_text(yaml.safe_dump(body))
    return path


def _layers(out: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, anndata.AnnData]:
    adata = anndata.read_h5ad(out / "imputed_cells.h5ad")
    imputed = adata.X.toarray().astype(np.int64)
    real = adata.layers["real_counts"].toarray().astype(np.int64)
    hidden = adata.layers["imputation_mask"].toarray().astype(bool)
    return imputed, real, hidden, adata


@pytest.mark.slow
def test_the_published_command_line_writes_st3s_files_in_st3s_formats(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    _cells(tmp_path / "test.h5ad")
    config = _rnaseq_small(tmp_path / "rnaseq_small.yaml", None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "inference_imputation.py"), "--config",
         config.name, "--experiment_dir", "experiments/tiny_mlm", "--data_path", "test.h5ad"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    out = exp / "imputation_results"
    assert {p.name for p in out.iterdir()} == ST3_FILES | CELL_FILES | SEDD_FILES
    number = r"\d\.\d{6}"
    assert re.fullmatch(number + "\n", (out / "accuracy.txt").read_text())
    assert re.fullmatch(r'\{"mae_bins": \d+\.\d{6}\}' + "\n", (out / "mae.json").read_text())
    for k in (1, 3, 5, 10):
        assert re.fullmatch(f"within_{k},{number}\n", (out / f"within_{k}.csv").read_text())
    for i in range(3):
        assert re.fullmatch(number + "\n", (out / f"cell_{i}_acc.txt").read_text())
        assert json.loads((out / f"cell_{i}_mae.json").read_text()).keys() == {"mae_bins"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics) == ["accuracy", "mae_bins", "within_k", "mask_ratio", "num_steps",
                             "temperature", "num_masked_positions", "checkpoint"]  # fmt: skip
    assert list(metrics["within_k"]) == ["1", "3", "5", "10"]
    # the YAML's inference section, st3's found checkpoint as st3 names it
    assert (metrics["mask_ratio"], metrics["num_steps"], metrics["temperature"]) == (0.2, 50, 1.0)
    assert metrics["checkpoint"] == "experiments/tiny_mlm/final.pt"
    assert "note: --num_workers: accepted for st3 compatibility" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_scores_are_those_of_the_written_cells_and_st3s_split(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad", n_cells=40)
    out = _impute(exp, data, "--val_fraction", "0.2", "--seed", "5")
    imputed, real, hidden, adata = _layers(out)
    # st3's train_val_split: randperm under the seed, the last int(40 * 0.2) = 8 held out
    order = torch.randperm(40, generator=torch.Generator().manual_seed(5)).numpy()
    assert list(adata.obs["data_row"]) == list(order[-8:])
    assert list(adata.obs_names) == [f"cell_{i}" for i in order[-8:]]
    source = anndata.read_h5ad(data).X
    assert np.array_equal(real, source[order[-8:]])
    assert np.array_equal(imputed[~hidden], real[~hidden])  # what was not hidden is kept
    error = np.abs(imputed[hidden] - real[hidden])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_masked_positions"] == hidden.sum() > 0
    assert math.isclose(metrics["mae_bins"], error.mean(), abs_tol=1e-6)
    assert math.isclose(metrics["accuracy"], (error == 0).mean(), abs_tol=1e-6)
    assert (out / "mae.json").read_text() == f'{{"mae_bins": {error.mean():.6f}}}\n'
    assert (out / "accuracy.txt").read_text() == f"{(error == 0).mean():.6f}\n"
    for k in (1, 3, 5, 10):
        assert (out / f"within_{k}.csv").read_text() == f"within_{k},{(error <= k).mean():.6f}\n"
        assert math.isclose(metrics["within_k"][str(k)], (error <= k).mean(), abs_tol=1e-6)
    for i in range(3):  # st3's per-cell files: the first --num_cells_visualize cells
        cell = np.abs(imputed[i][hidden[i]] - real[i][hidden[i]])
        assert (out / f"cell_{i}_acc.txt").read_text() == f"{(cell == 0).mean():.6f}\n"
        assert json.loads((out / f"cell_{i}_mae.json").read_text())["mae_bins"] == round(
            cell.mean(), 6
        )
    assert adata.uns["st3_imputation"]["mae_bins"] == metrics["mae_bins"]
    assert adata.uns["sedd"]["steps"] == 2 and adata.uns["sedd"]["seed"] == 5


def test_mask_ratio_is_respected_and_a_cells_mask_depends_only_on_seed_and_row(
    tmp_path: Path,
) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad", n_cells=40)
    out = _impute(exp, data, "--val_fraction", "1.0", "--mask_ratio", "0.5")
    _, _, hidden, adata = _layers(out)
    assert 0.45 < hidden.mean() < 0.55  # 2,560 entries: 0.5 +- 0.01 standard error
    rows = adata.obs["data_row"].to_numpy()
    assert torch.equal(torch.from_numpy(hidden), entry_mask(42, rows, 64, 0.5))
    # the first batch alone (another run, another batch size): its cells are masked alike
    few = tmp_path / "few"
    _impute(exp, data, "--val_fraction", "1.0", "--mask_ratio", "0.5", "--num_batches", "1",
            "--batch_size", "3", "--output_dir", str(few))  # fmt: skip
    _, _, hidden_few, adata_few = _layers(few)
    assert list(adata_few.obs["data_row"]) == list(rows[:3])
    assert np.array_equal(hidden_few, hidden[:3])


@pytest.mark.parametrize("value", ["0", "-0.2", "nan", "2"])
def test_a_mask_ratio_outside_0_1_is_refused_before_loading(tmp_path: Path, value: str) -> None:
    exp = _experiment(tmp_path)
    with pytest.raises(ValueError, match=r"^--mask_ratio must be in \(0, 1\], got "):
        _impute(exp, tmp_path / "absent.h5ad", "--mask_ratio", value)
    assert not (exp / "imputation_results").exists()


def test_a_bad_mask_ratio_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad")
    argv = [sys.executable, str(ROOT / "scripts" / "inference_imputation.py"), "--experiment_dir",
            str(exp), "--data_path", str(data), "--mask_ratio", "1.5"]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         check=False)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("inference_imputation.py: error: --mask_ratio must be in (0, 1], got "
                           "1.5: ")  # fmt: skip
    config = _rnaseq_small(tmp_path / "c.yaml", data, mask_ratio=1.5)
    with pytest.raises(ValueError, match=r"--mask_ratio \(inference.mask_ratio in --config .*c"
                       r"\.yaml\) must be in \(0, 1\], got 1.5"):  # fmt: skip
        inference_imputation(["--experiment_dir", str(exp), "--config", str(config)])


def test_the_yaml_sets_mask_ratio_and_the_command_line_wins(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad", n_cells=40)
    config = _rnaseq_small(tmp_path / "c.yaml", data, mask_ratio=0.6, num_steps=2)
    Path(config).write_text(Path(config).read_text().replace("val_fraction: 0.1",
                                                             "val_fraction: 1.0"))  # fmt: skip
    base = ["--experiment_dir", str(exp), "--config", str(config), "--seed", "9"]
    assert inference_imputation(base) == 0
    out = exp / "imputation_results"
    _, _, hidden, adata = _layers(out)
    assert json.loads((out / "metrics.json").read_text())["mask_ratio"] == 0.6
    assert 0.55 < hidden.mean() < 0.65 and adata.n_obs == 40  # data.val_fraction 1.0: all cells
    assert adata.uns["sedd"]["seed"] == 9 and adata.uns["sedd"]["steps"] == 2
    assert inference_imputation([*base, "--mask_ratio", "0.1", "--overwrite"]) == 0
    _, _, hidden, _ = _layers(out)
    assert json.loads((out / "metrics.json").read_text())["mask_ratio"] == 0.1
    assert 0.07 < hidden.mean() < 0.13


def test_an_existing_result_is_refused_unless_overwrite(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad")
    out = _impute(exp, data)
    before = (out / "metrics.json").read_text()
    with pytest.raises(FileExistsError, match="--overwrite"):
        _impute(exp, data, "--seed", "1")
    assert (out / "metrics.json").read_text() == before
    (out / "cell_7_acc.txt").write_text("0.5\n")  # an older run's, with more cells shown
    _impute(exp, data, "--seed", "1", "--overwrite")
    assert not (out / "cell_7_acc.txt").exists()
    assert anndata.read_h5ad(out / "imputed_cells.h5ad").uns["sedd"]["seed"] == 1


def test_every_upstream_flag_is_in_the_table_once() -> None:
    flags = [f.flag for f in flags_for("imputation")]
    assert sorted(flags) == sorted(UPSTREAM_FLAGS)
    noted = {f.flag for f in flags_for("imputation") if f.noted}
    assert noted == {"--num_workers"}


@pytest.mark.slow
def test_the_job_script_runs_end_to_end_without_slurm(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    data = _cells(tmp_path / "test.h5ad")
    config = _rnaseq_small(tmp_path / "c.yaml", None, num_steps=2)
    results = tmp_path / "results"
    run = job("inf_imputation.sh", EXPERIMENT_DIR=str(exp), CONFIG=str(config),
              DATA_PATH=str(data), MASK_RATIO="0.4", VAL_FRACTION="0.5", SEED="3",
              OUTPUT_DIR=str(results), OMP_NUM_THREADS="1")  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert {p.name for p in results.iterdir()} == ST3_FILES | CELL_FILES | SEDD_FILES
    metrics = json.loads((results / "metrics.json").read_text())
    assert (metrics["mask_ratio"], metrics["num_steps"]) == (0.4, 2)
    adata = anndata.read_h5ad(results / "imputed_cells.h5ad")
    assert adata.n_obs == 15 and adata.uns["sedd"]["seed"] == 3
    again = job("inf_imputation.sh", EXPERIMENT_DIR=str(exp), DATA_PATH=str(data),
                OUTPUT_DIR=str(results))  # fmt: skip
    assert again.returncode == 2 and "OVERWRITE=1" in again.stderr
    array = job("inf_imputation.sh", EXPERIMENT_DIR=str(exp), SLURM_ARRAY_TASK_COUNT="4")
    assert array.returncode == 2 and "without --array" in array.stderr


@pytest.mark.skipif(not (BUNDLED / "config.json").exists(), reason="bundled model missing")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_bundled_model_imputes_real_pbmc_cells(tmp_path: Path) -> None:
    out = tmp_path / "pbmc"
    argv = ["--experiment_dir", str(BUNDLED), "--data_path", str(ROOT / "data" /
            "pbmc68k_counts.h5ad"), "--num_batches", "1", "--batch_size", "2", "--num_steps",
            "2", "--output_dir", str(out)]  # fmt: skip
    assert inference_imputation(argv) == 0
    imputed, real, hidden, adata = _layers(out)
    assert adata.n_obs == 2 and adata.var_names[0] == "HES4" and "bulk_labels" in adata.obs
    assert np.array_equal(imputed[~hidden], real[~hidden])
    error = np.abs(imputed[hidden] - real[hidden]).mean()
    assert (out / "mae.json").read_text() == f'{{"mae_bins": {error:.6f}}}\n'
