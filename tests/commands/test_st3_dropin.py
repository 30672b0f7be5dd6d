"""st3 invocations as an st3 user types them: every flag of st3's inference scripts (the table in
``sedd.commands.st3_flags``), a ``--config`` YAML with all three sections, and the job scripts
with every st3 variable; the output holds what st3 would have made (cells, steps, temperature,
seed, labels, genes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import yaml
from st3_runs import job

from sedd.commands.st3_flags import ST3_FLAGS, flags_for
from sedd.commands.st3_scripts import inference_conditional, inference_generation

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
ROOT = Path(__file__).resolve().parents[2]
ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"
POSITIONAL = [str(i) for i in range(64)]  # st3 stores no gene names: '0'..'G-1', as st3 writes


def _experiment(name: str, root: Path) -> Path:
    dst = root / "experiments" / name
    shutil.copytree(ST3 / name, dst)
    return dst


def _cells(path: Path, labels: list[str], per_label: int, genes: list[str]) -> Path:
    """Real-looking counts: ``per_label`` cells of each label in obs['gene'] (st3's --gene)."""
    rng = np.random.default_rng(0)
    obs = pd.DataFrame({"gene": [lab for lab in labels for _ in range(per_label)]})
    obs.index = [f"real_{i}" for i in range(len(obs))]
    counts = rng.poisson(1.0, size=(len(obs), len(genes))).astype(np.int64)
    anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=genes)).write_h5ad(path)
    return path


def _yaml(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body))
    return path


def _conditional_argv(tmp_path: Path, exp: Path) -> tuple[list[str], dict]:
    """Every flag of st3's inference_conditional.py, plus a YAML with data/inference/other."""
    test = _cells(tmp_path / "test.h5ad", ["GENE_A", "non-targeting"], 4, POSITIONAL)
    names_all = tmp_path / "names_all.txt"
    names_all.write_text("non-targeting\nGENE_A\nGENE_B\nGENE_C\nGENE_D\n")
    listed = tmp_path / "listed.txt"
    listed.write_text("GENE_C\n")  # the YAML's list: the command line's --perturbations wins
    config = _yaml(
        tmp_path / "perturbseq.yaml",
        {
            "model": {"hidden_dim": 64},  # a training section: st3 shares one YAML
            "data": {
                "control_name": "non-targeting",
                "gene": "gene",
                "test_data_path": str(test),
                "train_data_path": str(test),
                "pert_col": "gene",
                "cond_labels_pt_path": str(exp / "protein_embeddings.pt"),
            },
            "inference": {
                "perturbations_file": str(listed),
                "perturbations_all_file": str(names_all),
                "num_samples_per_pert": 3,
                "num_steps": 7,
                "temperature": 0.8,
                "num_cells_visualize": 2,
                "sampler": "euler",
            },
            "other": {"seed": 5, "num_workers": 4},
        },
    )
    values = {
        "--config": [str(config)],
        "--experiment_dir": [str(exp.relative_to(tmp_path))],
        "--checkpoint": [str((exp / "final.pt").relative_to(tmp_path))],  # st3: from the cwd
        "--perturbations_file": [str(listed)],
        "--perturbations_all_file": [str(names_all)],
        "--perturbations": ["GENE_A", "non-targeting"],
        "--test_data_path": [str(test)],
        "--mapping_data_path": [str(test)],
        "--cond_labels_pt_path": [str(exp / "protein_embeddings.pt")],
        "--gene": ["gene"],
        "--control_name": ["non-targeting"],
        "--num_samples_per_pert": ["2"],
        "--num_steps": ["4"],
        "--temperature": ["0.9"],
        "--seed": ["11"],
        "--evaluate": [],
        "--num_cells_visualize": ["3"],
        "--sampler": ["analytic"],
        "--batch_size": ["3"],
        "--num_workers": ["2"],
    }
    return values, {"config": config, "test": test}


def test_every_st3_conditional_flag_and_yaml_section_means_what_it_means_in_st3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment("tiny_pert_ct_esm", tmp_path)
    values, _ = _conditional_argv(tmp_path, exp)
    table = {f.flag for f in flags_for("conditional")}
    assert table == set(values), f"flags without a test value: {table ^ set(values)}"
    # --perturbations_file and --perturbations on one command line name the list twice
    argv = [
        w for flag, vals in values.items() if flag != "--perturbations_file" for w in (flag, *vals)
    ] + ["--precision", "fp32", "--cell_type", "jurkat"]
    monkeypatch.chdir(tmp_path)  # --checkpoint and --experiment_dir are relative to the cwd
    assert inference_conditional(argv) == 0
    out = exp / "inference_results" / "generated_cells.h5ad"
    adata = anndata.read_h5ad(out)
    # what st3 does: --num_samples_per_pert cells of each listed perturbation, in order
    assert list(adata.obs["perturbation"]) == ["GENE_A"] * 2 + ["non-targeting"] * 2
    assert list(adata.var_names) == POSITIONAL and set(adata.obs["cell_type"]) == {"jurkat"}
    record = adata.uns["sedd"]
    assert (record["steps"], record["temperature"], record["seed"]) == (4, 0.9, 11)
    meta = json.loads((out.parent / "generation_metadata.json").read_text())
    assert meta["num_cells"] == 4 and meta["output"] == str(out.relative_to(tmp_path))
    # --evaluate ran `sedd evaluate` against --test_data_path, labels from obs[--gene]
    metrics = json.loads((out.parent / "generated_cells_eval" / "metrics.json").read_text())
    assert set(metrics["per_condition"]) >= {"GENE_A", "non-targeting"}
    err = capsys.readouterr().err
    assert "note: --mapping_data_path: accepted for st3 compatibility" in err
    assert "note: --num_cells_visualize: accepted for st3 compatibility" in err
    [unread] = [line for line in err.splitlines() if "not read by this script" in line]
    assert "model (section)" in unread and "data.pert_col" in unread
    assert "inference.sampler" not in unread and "other.num_workers" not in unread
    assert "note: --num_workers: accepted for st3 compatibility" in err
    assert record["sampler"] == "analytic"


def test_the_yaml_sets_defaults_and_the_command_line_wins(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    config = _yaml(
        tmp_path / "c.yaml",
        {
            "inference": {"num_samples_per_pert": 3, "num_steps": 7, "temperature": 0.5},
            "other": {"seed": 2},
        },
    )
    base = [
        "--experiment_dir",
        str(exp),
        "--config",
        str(config),
        "--perturbations",
        "GENE_B",
        "--precision",
        "fp32",
    ]
    assert inference_conditional([*base, "--num_steps", "4"]) == 0
    adata = anndata.read_h5ad(exp / "inference_results" / "generated_cells.h5ad")
    record = adata.uns["sedd"]
    assert adata.n_obs == 3 and record["steps"] == 4  # YAML's 3 cells, the command line's steps
    assert record["temperature"] == 0.5 and record["seed"] == 2


def test_st3_defaults_without_flags_or_config(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    assert (
        inference_conditional(
            [
                "--experiment_dir",
                str(exp),
                "--perturbations",
                "GENE_D",
                "--precision",
                "fp32",
                "--num_steps",
                "1",
            ]
        )
        == 0
    )
    adata = anndata.read_h5ad(exp / "inference_results" / "generated_cells.h5ad")
    assert adata.n_obs == 10 and adata.uns["sedd"]["seed"] == 42  # st3's 10 cells and seed 42
    assert adata.uns["sedd"]["temperature"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "missing.yaml"], "--config missing.yaml: file not found"),
        (["--perturbations", "GENE_A", "--perturbations_file", "p.txt"], "pass one of them"),
        (["--evaluate"], "--evaluate needs --test_data_path"),
        (["--genes_file", "x"], "unrecognized arguments: --genes_file"),
    ],
)
def test_st3_invocations_that_cannot_work_fail_in_one_line_before_sampling(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    (tmp_path / "p.txt").write_text("GENE_A\n")
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "inference_conditional.py"),
            "--experiment_dir",
            str(exp),
            "--precision",
            "fp32",
            *argv,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert not (exp / "inference_results").exists()


def test_gene_is_st3s_label_column_never_an_abbreviation_of_genes(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    argv = [
        "--experiment_dir",
        str(exp),
        "--gene",
        "gene",
        "--perturbations",
        "GENE_A",
        "--num_samples_per_pert",
        "1",
        "--num_steps",
        "1",
        "--precision",
        "fp32",
    ]
    assert inference_conditional(argv) == 0  # `--gene gene` read as a genes file would fail
    adata = anndata.read_h5ad(exp / "inference_results" / "generated_cells.h5ad")
    assert list(adata.var_names) == POSITIONAL


def test_every_st3_generation_flag_and_its_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _experiment("tiny_mlm", tmp_path)  # at experiments/tiny_mlm: the flags name it so
    genes = [f"REF{i}" for i in range(64)]
    reference = _cells(tmp_path / "ref.h5ad", ["x"], 2, genes)
    out = tmp_path / "elsewhere" / "cells.h5ad"
    config = _yaml(
        tmp_path / "gen.yaml",
        {
            "inference": {
                "num_generate": 4,
                "num_steps": 3,
                "temperature": 0.7,
                "reference_data": str(reference),
                "output_path": str(out),
                "keep_sparse": True,
            },
            "other": {"seed": 9},
        },
    )
    values = {
        "--config": [str(config)],
        "--experiment_dir": ["experiments/tiny_mlm"],
        "--checkpoint": ["experiments/tiny_mlm/final.pt"],
        "--reference_data": [str(reference)],
        "--num_generate": ["5"],
        "--num_steps": ["3"],
        "--temperature": ["0.7"],
        "--seed": ["12"],
        "--keep_sparse": [],
        "--output_path": [str(out)],
        "--num_cells_visualize": ["2"],
        "--data_path": [str(reference)],
        "--val_fraction": ["0.2"],
        "--use_train_split": [],
        "--num_real_visualize": ["2"],
        "--sampler": ["analytic"],
        "--batch_size": ["2"],
    }
    table = {f.flag for f in flags_for("generation")}
    assert table == set(values), f"flags without a test value: {table ^ set(values)}"
    monkeypatch.chdir(tmp_path)
    argv = [w for flag, vals in values.items() for w in (flag, *vals)] + ["--precision", "fp32"]
    assert inference_generation(argv) == 0
    adata = anndata.read_h5ad(out)
    assert adata.n_obs == 5 and list(adata.var_names) == genes  # var from --reference_data
    record = adata.uns["sedd"]
    assert (record["steps"], record["temperature"], record["seed"]) == (3, 0.7, 12)
    assert record["sampler"] == "analytic"
    meta = json.loads((out.parent / "cells.generation_metadata.json").read_text())
    assert meta["output"] == str(out) and meta["num_cells"] == 5


def test_the_table_lists_each_flag_once_per_script() -> None:
    for script in ("conditional", "generation", "perturbseq", "imputation"):
        flags = [f.flag for f in flags_for(script)]
        assert len(flags) == len(set(flags)), script
    assert all(f.flag.startswith("--") for f in ST3_FLAGS)


@pytest.mark.slow
def test_the_conditional_job_script_honours_every_st3_variable(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert_ct_esm", tmp_path)
    test = _cells(tmp_path / "test.h5ad", ["GENE_B", "non-targeting"], 4, POSITIONAL)
    config = _yaml(
        tmp_path / "c.yaml",
        {"inference": {"temperature": 0.3, "num_steps": 9}, "data": {"gene": "gene"}},
    )
    perts = tmp_path / "perts.txt"
    perts.write_text("GENE_B\nnon-targeting\n")
    run = job(
        "inf_conditional.sh",
        EXPERIMENT_DIR=str(exp),
        CONFIG=str(config),
        CHECKPOINT=str(exp / "final.pt"),
        PERTURBATIONS_FILE=str(perts),
        MAPPING_DATA_PATH=str(test),
        TEST_DATA_PATH=str(test),
        TEMPERATURE="0.6",
        EVALUATE="true",
        NUM_SAMPLES_PER_PERT="2",
        NUM_STEPS="3",
        CELL_TYPE="rpe1",
        SEED="8",
        COND_LABELS_PT_PATH=str(exp / "protein_embeddings.pt"),
        PRECISION="fp32",
        NUM_SHARDS="2",
    )  # the variables win over CONFIG's YAML, which still sets --gene
    assert run.returncode == 0, run.stderr[-2000:]
    out = exp / "inference_results" / "generated_cells.h5ad"
    adata = anndata.read_h5ad(out)
    assert list(adata.obs["perturbation"]) == ["GENE_B"] * 2 + ["non-targeting"] * 2
    assert set(adata.obs["cell_type"]) == {"rpe1"}
    record = adata.uns["sedd"]
    assert (record["steps"], record["temperature"], record["seed"]) == (3, 0.6, 8)
    meta = json.loads((out.parent / "generation_metadata.json").read_text())
    assert meta["num_cells"] == 4 and meta["request"]["steps"] == 3
    assert (out.parent / "generated_cells_eval" / "metrics.json").is_file()  # EVALUATE=true


@pytest.mark.slow
def test_the_generation_job_script_honours_every_st3_variable(tmp_path: Path) -> None:
    exp = _experiment("tiny_mlm", tmp_path)
    genes = [f"G{i}" for i in range(64)]
    reference = _cells(tmp_path / "ref.h5ad", ["x"], 2, genes)
    out = tmp_path / "gen" / "cells.h5ad"
    config = _yaml(tmp_path / "c.yaml", {"inference": {"num_generate": 3}})
    run = job(
        "inf_generation.sh",
        EXPERIMENT_DIR=str(exp),
        CONFIG=str(config),
        CHECKPOINT=str(exp / "final.pt"),
        REFERENCE_DATA=str(reference),
        OUTPUT_PATH=str(out),
        KEEP_SPARSE="true",
        NUM_STEPS="2",
        TEMPERATURE="0.9",
        SEED="4",
        PRECISION="fp32",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    adata = anndata.read_h5ad(out)
    assert adata.n_obs == 3 and list(adata.var_names) == genes
    record = adata.uns["sedd"]
    assert (record["steps"], record["temperature"], record["seed"]) == (2, 0.9, 4)
    assert "cell/s]" not in run.stderr  # no progress bar redrawn into a job's log


def test_an_output_path_that_is_not_h5ad_is_refused_before_loading(tmp_path: Path) -> None:
    exp = _experiment("tiny_mlm", tmp_path)
    out = tmp_path / "cells.csv"
    with pytest.raises(ValueError, match=r"--output_path .*cells.csv.*\.h5ad"):
        inference_generation(["--experiment_dir", str(exp), "--output_path", str(out)])
    assert not out.exists()


@pytest.mark.slow
def test_a_sharded_generation_job_merges_into_the_yamls_output_path(tmp_path: Path) -> None:
    """st3 reads inference.output_path from CONFIG; with shards the job script merges there
    too (it used to merge into $OUTPUT_DIR/generated_cells.h5ad when only the YAML named it)."""
    exp = _experiment("tiny_mlm", tmp_path)
    out = tmp_path / "from_yaml" / "cells.h5ad"
    config = _yaml(tmp_path / "c.yaml", {"inference": {"num_generate": 4, "output_path": str(out)}})
    run = job("inf_generation.sh", EXPERIMENT_DIR=str(exp), CONFIG=str(config), NUM_STEPS="2",
              PRECISION="fp32", NUM_SHARDS="2")  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert anndata.read_h5ad(out).n_obs == 4
    assert not (exp / "inference" / "generated_cells.h5ad").exists()
    missing = job("inf_generation.sh", EXPERIMENT_DIR=str(exp), CONFIG=str(tmp_path / "no.yaml"))
    assert missing.returncode == 2 and "no.yaml: file not found" in missing.stderr
