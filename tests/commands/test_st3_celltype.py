"""st3's cell-type inference (branch mismatch-celltype, ``celltype_cond/``) run as published on
the st3_celltype fixture: the Python script with its flags, the example YAML's keys, both bash
wrappers with their variables and ``--cell_types``; st3's folder, obs columns and
``generation_config.json``; a missing or unknown cell type refused in one line before sampling."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import anndata
import numpy as np
import pytest
import yaml
from st3_runs import job, run

from sedd.commands.st3_celltype import (
    ST3_OBS,
    celltype_main,
    inference_celltype_perturbseq,
    list_cell_types,
)
from sedd.commands.st3_flags import flags_for

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "upstream" / "st3_celltype"
# the fixture's labels, renamed as a real experiment names them (space, slash): weights unchanged
CELL_TYPES = ["B cell", "Mono/Macro", "T cell"]
PERTURBATIONS = ["non-targeting", "STAT1", "IRF1", "JAK1", "MYC"]  # args.json, index order
FAST = ["--precision", "fp32", "--num_steps", "2", "--no-progress"]
CONFIG_KEYS = ["experiment_dir", "checkpoint", "cell_type", "target_cell_types",
               "num_perturbations", "num_samples_per_condition", "num_steps", "temperature",
               "total_samples", "seed"]  # fmt: skip
UPSTREAM_FLAGS = {
    "--config", "--experiment_dir", "--checkpoint", "--data_path", "--gene", "--cell_type_col",
    "--control_name", "--cell_type", "--perturbations", "--perturbations_file",
    "--num_samples_per_condition", "--num_steps", "--temperature", "--batch_size",
    "--output_dir", "--save_h5ad", "--cond_labels_pt_path", "--celltype_labels_pt_path", "--seed",
}  # fmt: skip


def _experiment(root: Path) -> Path:
    exp = root / "experiments" / "celltype_model"
    shutil.copytree(FIXTURE, exp)
    args = json.loads((exp / "args.json").read_text())
    assert args["perturbations"] == PERTURBATIONS
    (exp / "args.json").write_text(json.dumps(args | {"cell_types": CELL_TYPES}))
    return exp


def _example_yaml(path: Path, **inference: object) -> Path:
    """st3's celltype_inference_example.yaml, every key, with ``inference`` overrides."""
    config = {
        "data": {"data_path": "data/test_data.h5ad", "gene": "gene",
                 "cell_type_col": "cell_type", "control_name": "non-targeting",
                 "cond_labels_pt_path": None, "celltype_labels_pt_path": None},
        "inference": {"cell_type": "T cell", "perturbations": None, "perturbations_file": None,
                      "num_samples_per_condition": 100, "num_steps": 50, "temperature": 1.0,
                      "batch_size": 32, "output_dir": None, "save_h5ad": True} | inference,
        "other": {"seed": 42},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _check_cells(folder: Path, cell_type: str, perturbations: list[str], per: int) -> None:
    """st3's obs columns, in st3's order and dtypes, with the model's indices."""
    adata = anndata.read_h5ad(folder / "generated_cells.h5ad")
    obs = adata.obs
    assert tuple(obs.columns[:5]) == ST3_OBS
    kinds = [str(obs[c].dtype) for c in ST3_OBS]
    assert kinds == ["category", "category", "int64", "int64", "bool"]
    assert list(obs["perturbation"]) == [p for p in perturbations for _ in range(per)]
    assert set(obs["cell_type"]) == {cell_type}
    assert (obs["celltype_idx"] == CELL_TYPES.index(cell_type)).all()
    assert list(obs["pert_idx"]) == [PERTURBATIONS.index(p) for p in obs["perturbation"]]
    assert (obs["pert_idx"] == obs["condition_idx"]).all()  # sedd's own columns stay
    assert obs["generated"].all() and adata.n_vars == 48
    assert adata.uns["sedd"]["request"]["cell_type"] == cell_type  # sedd's provenance stays


def _st3_config(folder: Path) -> dict[str, object]:
    config = json.loads((folder / "generation_config.json").read_text())
    assert list(config) == CONFIG_KEYS
    return config


def test_the_published_command_writes_st3s_folder_cells_and_config(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    argv = ["--experiment_dir", str(exp), "--cell_type", "T cell", "--num_samples_per_condition",
            "2", "--temperature", "0.9", "--seed", "7", *FAST]  # fmt: skip
    assert inference_celltype_perturbseq(argv) == 0
    folder = exp / "inference_results" / "celltype_T_cell"
    assert {p.name for p in folder.iterdir()} == {
        "generated_cells.h5ad", "generation_config.json", "generation_metadata.json",
        "generated_cells.metrics.json",
    }  # fmt: skip
    _check_cells(folder, "T cell", PERTURBATIONS, 2)
    assert _st3_config(folder) == {
        "experiment_dir": str(exp), "checkpoint": str(exp / "final.pt"), "cell_type": "T cell",
        "target_cell_types": ["T cell"], "num_perturbations": 5, "num_samples_per_condition": 2,
        "num_steps": 2, "temperature": 0.9, "total_samples": 10, "seed": 7,
    }  # fmt: skip


def test_the_example_yaml_sets_every_key_and_the_command_line_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment(tmp_path)
    listed = tmp_path / "perts.txt"
    listed.write_text("IRF1\nnon-targeting\n")
    config = _example_yaml(tmp_path / "c.yaml", num_samples_per_condition=3, num_steps=2,
                           perturbations_file=str(listed), output_dir=str(tmp_path / "out"),
                           temperature=0.5)  # fmt: skip
    argv = ["--config", str(config), "--experiment_dir", str(exp), "--cell_type", "Mono/Macro",
            "--precision", "fp32", "--no-progress"]  # fmt: skip
    assert inference_celltype_perturbseq(argv) == 0
    err = capsys.readouterr().err
    assert "not read by this script" not in err  # every key of st3's example is read
    for noted in ("--data_path", "--gene", "--cell_type_col", "--control_name", "--save_h5ad"):
        assert f"note: {noted}: accepted for st3 compatibility" in err
    folder = tmp_path / "out" / "celltype_Mono_Macro"  # output_dir, then st3's folder
    _check_cells(folder, "Mono/Macro", ["IRF1", "non-targeting"], 3)
    config_json = _st3_config(folder)
    assert (config_json["cell_type"], config_json["num_perturbations"]) == ("Mono/Macro", 2)
    assert (config_json["temperature"], config_json["total_samples"]) == (0.5, 6)


def test_unknown_perturbations_are_warned_about_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment(tmp_path)
    argv = ["--experiment_dir", str(exp), "--cell_type", "B cell", "--perturbations", "MYC",
            "NOPE", "STAT1", "--num_samples_per_condition", "1", *FAST]  # fmt: skip
    inference_celltype_perturbseq(argv)
    assert "skipped 1 perturbation(s) the model does not know" in capsys.readouterr().err
    folder = exp / "inference_results" / "celltype_B_cell"
    _check_cells(folder, "B cell", ["MYC", "STAT1"], 1)
    assert _st3_config(folder)["num_perturbations"] == 2
    meta = json.loads((folder / "generation_metadata.json").read_text())
    assert meta["skipped_perturbations"] == ["NOPE"]


@pytest.mark.parametrize(
    ("words", "says"),
    [
        ([], "--cell_type (job scripts: CELL_TYPE, or --cell_types of "
             "inference_all_celltypes.sh) is not set"),
        (["--cell_type", "NK cell"], "'NK cell' is not a cell type of the model"),
        (["--cell_type", "T cell", "--celltype_labels_pt_path", "ct.pt"],
         "--celltype_labels_pt_path ct.pt: sedd passes cell types as indices"),
    ],
)  # fmt: skip
def test_a_missing_or_unknown_cell_type_is_one_line_before_sampling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    words: list[str], says: str,
) -> None:  # fmt: skip
    exp = _experiment(tmp_path)
    argv = ["inference_celltype_perturbseq.py", "--experiment_dir", str(exp), *words, *FAST]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        celltype_main()
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inference_celltype_perturbseq.py: error: ")
    assert says in lines[0]
    if "--celltype_labels" not in says:
        assert "one of 'B cell', 'Mono/Macro', 'T cell'" in lines[0]
    assert not (exp / "inference_results").exists()  # nothing sampled, nothing written


def test_a_result_is_refused_before_loading_unless_overwrite(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    argv = ["--experiment_dir", str(exp), "--cell_type", "B cell",
            "--num_samples_per_condition", "1", *FAST]  # fmt: skip
    inference_celltype_perturbseq(argv)
    folder = exp / "inference_results" / "celltype_B_cell"
    before = (folder / "generation_config.json").read_text()
    with pytest.raises(FileExistsError, match="--overwrite"):
        inference_celltype_perturbseq([*argv, "--seed", "1"])
    assert (folder / "generation_config.json").read_text() == before
    inference_celltype_perturbseq([*argv, "--seed", "1", "--overwrite"])
    assert _st3_config(folder)["seed"] == 1


@pytest.mark.slow
def test_the_job_script_reads_st3s_variables(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    listed = tmp_path / "perts.txt"
    listed.write_text("JAK1\n")
    run = job("inference_celltype.sh", f"EXPERIMENT_DIR={exp}", "CELL_TYPE=T cell",
              "--no-progress", NUM_SAMPLES="2", PERTURBATIONS_FILE=str(listed),
              OUTPUT_DIR=str(tmp_path / "out"), DATA_PATH=str(tmp_path / "test.h5ad"),
              NUM_STEPS="2", PRECISION="fp32")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "--data_path: accepted for st3 compatibility" in run.stderr
    folder = tmp_path / "out" / "celltype_T_cell"
    _check_cells(folder, "T cell", ["JAK1"], 2)
    assert _st3_config(folder)["total_samples"] == 2


@pytest.mark.slow
def test_the_all_cell_types_script_runs_each_listed_cell_type(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    run = job("inference_all_celltypes.sh", "--experiment_dir", str(exp), "--cell_types",
              "B cell", "Mono/Macro", "--num_samples", "1", "NUM_STEPS=2", "PRECISION=fp32",
              "--data_path", str(tmp_path / "test.h5ad"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    results = exp / "inference_results"
    assert sorted(p.name for p in results.iterdir()) == ["celltype_B_cell", "celltype_Mono_Macro"]
    for cell_type, folder in (("B cell", "celltype_B_cell"), ("Mono/Macro", "celltype_Mono_Macro")):
        _check_cells(results / folder, cell_type, PERTURBATIONS, 1)
        assert _st3_config(results / folder)["num_samples_per_condition"] == 1


def test_without_cell_types_the_script_takes_the_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment(tmp_path)
    assert list_cell_types(["--experiment_dir", str(exp)]) == 0
    assert capsys.readouterr().out.splitlines() == CELL_TYPES
    run = job("inference_all_celltypes.sh", "--cell_types", "--experiment_dir", str(exp))
    assert run.returncode == 2 and "--cell_types names no cell type" in run.stderr
    run = job("inference_all_celltypes.sh", "--num_samples", "1", "--bogus")
    assert run.returncode == 2 and "unknown option --bogus" in run.stderr


def test_every_upstream_flag_is_in_the_table_once() -> None:
    flags = [f.flag for f in flags_for("celltype")]
    assert sorted(flags) == sorted(UPSTREAM_FLAGS)
    noted = {f.flag for f in flags_for("celltype") if f.noted}
    assert noted == {"--data_path", "--gene", "--cell_type_col", "--control_name", "--save_h5ad"}
    defaults = {f.flag: f.kwargs.get("default") for f in flags_for("celltype")}
    assert defaults["--num_samples_per_condition"] == 100 and defaults["--batch_size"] == 32
    assert (defaults["--num_steps"], defaults["--seed"], defaults["--gene"]) == (50, 42, "gene")
    assert np.isclose(defaults["--temperature"], 1.0)


def test_the_slurm_file_runs_the_job_script_and_names_what_is_missing() -> None:
    done = run(["bash", "slurm/inference_celltype.sbatch", "CELL_TYPE=T cell"])
    assert done.returncode == 2
    assert "error: EXPERIMENT_DIR is not set" in done.stderr.strip().splitlines()[-1]


def test_a_yaml_list_of_perturbations_is_read_as_st3_reads_it(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    config = _example_yaml(tmp_path / "c.yaml", perturbations=["MYC", "IRF1"],
                           num_samples_per_condition=1, num_steps=2)  # fmt: skip
    argv = ["--config", str(config), "--experiment_dir", str(exp), "--cell_type", "B cell",
            "--precision", "fp32", "--no-progress"]  # fmt: skip
    assert inference_celltype_perturbseq(argv) == 0
    _check_cells(exp / "inference_results" / "celltype_B_cell", "B cell", ["MYC", "IRF1"], 1)
