"""The command lines DCM's release and st3 publish, run as written on the repository's fixtures:
KEY=VALUE words, both unconditional script names, the job-script variables (PERTURBATIONS_ALL_FILE
above all: a name must never reach the wrong label index), st3's skip of unknown perturbations,
and ``--evaluate`` checked before sampling."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
from st3_runs import job

from sedd.commands.st3_scripts import inference_conditional, inference_perturbseq

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
ROOT = Path(__file__).resolve().parents[2]
ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"
FAST = ["--precision", "fp32", "--num_steps", "2"]


def _experiment(name: str, root: Path) -> Path:
    dst = root / "experiments" / name
    shutil.copytree(ST3 / name, dst)
    return dst


def _dcm_experiment(root: Path) -> Path:
    """tiny_pert as DCM's release leaves it: args.json names a {name: index} label file (its
    scalar conditional labels, one name mapped to -1), the control is PBS, labels in 'cytokine'."""
    exp = _experiment("tiny_pert", root)
    (exp / "perturbation_names_all.txt").unlink()
    labels = {"PBS": 0, "IL6": 1, "TNF": -1, "IFNG": 4, "IL2": 2, "IL10": 3}
    torch.save(labels, root / "cytokines.pt")
    args = json.loads((exp / "args.json").read_text())
    args |= {"control_name": "PBS", "gene": "cytokine",
             "model_name": "SEDDPerturbationTransformerSmall",
             "cond_labels_pt_path": str(root / "cytokines.pt")}  # fmt: skip
    (exp / "args.json").write_text(json.dumps(args))
    return exp


def _cells(path: Path, labels: list[str], per_label: int, genes: list[str], key: str) -> Path:
    rng = np.random.default_rng(0)
    obs = pd.DataFrame({key: [lab for lab in labels for _ in range(per_label)]})
    obs.index = [f"real_{i}" for i in range(len(obs))]
    counts = rng.poisson(1.0, size=(len(obs), len(genes))).astype(np.int64)
    anndata.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=genes)).write_h5ad(path)
    return path


def _cells_of(out: Path) -> np.ndarray:
    return np.asarray(anndata.read_h5ad(out).X.todense())


def test_dcm_readme_key_value_words_run_and_are_printed_once_as_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _dcm_experiment(tmp_path)
    (tmp_path / "test_cytokines.txt").write_text("IFNG\nIL2\n")
    words = [f"EXPERIMENT_DIR={exp}", f"PERTURBATIONS_FILE={tmp_path / 'test_cytokines.txt'}",
             "NUM_SAMPLES_PER_PERT=2", "NUM_STEPS=2", "PRECISION=fp32"]  # fmt: skip
    assert inference_conditional(words) == 0
    err = capsys.readouterr().err
    assert err.count("note: read as:") == 1
    assert f"--experiment_dir {exp}" in err and "--num_samples_per_pert 2" in err
    out = exp / "inference_results" / "generated_cells.h5ad"
    adata = anndata.read_h5ad(out)
    assert list(adata.obs["perturbation"]) == ["IFNG", "IFNG", "IL2", "IL2"]
    assert list(adata.obs["condition_idx"]) == [4, 4, 2, 2]  # the index file's rows
    assert adata.uns["sedd"]["steps"] == 2
    # the same request as flags writes the same cells: the words are only another spelling
    flags = ["--experiment_dir", str(exp), "--perturbations", "IFNG", "IL2",
             "--num_samples_per_pert", "2", "--output_dir", str(tmp_path / "flags"),
             *FAST]  # fmt: skip
    assert inference_conditional(flags) == 0
    np.testing.assert_array_equal(_cells_of(out), _cells_of(tmp_path / "flags" / out.name))


@pytest.mark.parametrize("word", ["EXPERIMENTDIR=x", "EVALUATE=maybe"])
def test_a_key_value_word_naming_nothing_is_one_line_naming_it(tmp_path: Path, word: str) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    with pytest.raises(ValueError, match=word.split("=")[0]):
        inference_conditional(["--experiment_dir", str(exp), word, *FAST])
    assert not (exp / "inference_results").exists()


def test_the_index_file_fixes_each_name_whatever_list_or_variable_is_given(
    tmp_path: Path,
) -> None:
    exp = _dcm_experiment(tmp_path)
    # the release's all_perturbations_file: a plain list whose order is NOT the index order
    (tmp_path / "all_cytokines.txt").write_text("PBS\nIFNG\nIL2\nIL10\nIL6\n")
    base = ["--experiment_dir", str(exp), "--perturbations", "IFNG", "--num_samples_per_pert",
            "2", *FAST]  # fmt: skip
    assert inference_conditional([*base, "--output_dir", str(tmp_path / "a")]) == 0
    listed = ["--perturbations_all_file", str(tmp_path / "all_cytokines.txt")]
    with pytest.warns(UserWarning, match="its order is not used"):
        assert inference_conditional([*base, *listed, "--output_dir", str(tmp_path / "b")]) == 0
    a, b = (anndata.read_h5ad(tmp_path / d / "generated_cells.h5ad") for d in "ab")
    assert list(a.obs["condition_idx"]) == list(b.obs["condition_idx"]) == [4, 4]  # list says 1
    np.testing.assert_array_equal(a.X.todense(), b.X.todense())


@pytest.mark.slow
def test_perturbations_all_file_variable_reaches_the_script(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    # training order with GENE_A last: through the variable and through the flag GENE_A is 4
    order = tmp_path / "order.txt"
    order.write_text("non-targeting\nGENE_D\nGENE_C\nGENE_B\nGENE_A\n")
    common = {"EXPERIMENT_DIR": str(exp), "NUM_SAMPLES_PER_PERT": "1", "NUM_STEPS": "2",
              "PRECISION": "fp32"}  # fmt: skip
    (tmp_path / "want.txt").write_text("GENE_A\n")
    by_var = job("inf_conditional.sh", **common, PERTURBATIONS_ALL_FILE=str(order),
                 PERTURBATIONS_FILE=str(tmp_path / "want.txt"),
                 OUTPUT_DIR=str(tmp_path / "var"))  # fmt: skip
    assert by_var.returncode == 0, by_var.stderr
    assert inference_conditional(["--experiment_dir", str(exp), "--perturbations", "GENE_A",
                                  "--perturbations_all_file", str(order),
                                  "--num_samples_per_pert", "1", "--output_dir",
                                  str(tmp_path / "flag"), *FAST]) == 0  # fmt: skip
    assert inference_conditional(["--experiment_dir", str(exp), "--perturbations", "GENE_A",
                                  "--num_samples_per_pert", "1", "--output_dir",
                                  str(tmp_path / "default"), *FAST]) == 0  # fmt: skip
    var, flag, default = (anndata.read_h5ad(tmp_path / d / "generated_cells.h5ad")
                          for d in ("var", "flag", "default"))  # fmt: skip
    assert list(var.obs["condition_idx"]) == list(flag.obs["condition_idx"]) == [4]
    assert list(default.obs["condition_idx"]) == [1]  # the model's own names file: GENE_A is 1
    np.testing.assert_array_equal(var.X.todense(), flag.X.todense())
    # two label files named by the old and the new variable: refused, nothing sampled
    clash = job(
        "inf_conditional.sh",
        **common,
        PERTURBATIONS_ALL_FILE=str(order),
        PERTURBATION_MAP=str(tmp_path / "want.txt"),
        OUTPUT_DIR=str(tmp_path / "x"),
    )
    assert clash.returncode == 2 and "set PERTURBATIONS_ALL_FILE only" in clash.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_job_script_takes_the_readme_words_as_variables(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    run = job(
        "inf_conditional.sh",
        f"EXPERIMENT_DIR={exp}",
        "NUM_SAMPLES_PER_PERT=1",
        "NUM_STEPS=2",
        "PRECISION=fp32",
        "CELL_TYPE=",
        f"OUTPUT_DIR={tmp_path / 'o'}",
    )
    assert run.returncode == 0, run.stderr
    assert "note: EXPERIMENT_DIR=" in run.stderr
    assert anndata.read_h5ad(tmp_path / "o" / "generated_cells.h5ad").n_obs == 5  # 5 labels


def test_unknown_perturbations_are_warned_about_and_skipped_as_st3_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    (tmp_path / "test_list.txt").write_text("GENE_B\nNOT_TRAINED\nGENE_C\n")
    argv = ["--experiment_dir", str(exp), "--perturbations_file", str(tmp_path / "test_list.txt"),
            "--num_samples_per_pert", "1", *FAST]  # fmt: skip
    assert inference_conditional(argv) == 0
    captured = capsys.readouterr()
    assert "skipped 1 perturbation(s) the model does not know" in captured.err
    assert "NOT_TRAINED" in captured.out  # the summary names it too
    out = exp / "inference_results"
    assert list(anndata.read_h5ad(out / "generated_cells.h5ad").obs["perturbation"]) == [
        "GENE_B", "GENE_C"]  # fmt: skip
    meta = json.loads((out / "generation_metadata.json").read_text())
    assert meta["skipped_perturbations"] == ["NOT_TRAINED"]
    # st3's and DCM's keys, beside sedd's
    assert meta["perturbations"] == ["GENE_B", "GENE_C"] and meta["num_perturbations"] == 2
    assert (meta["num_samples_per_pert"], meta["num_steps"], meta["temperature"]) == (1, 2, 1.0)
    assert meta["checkpoint"] == str(exp / "final.pt") and meta["cell_type"] is None
    # none known: an error with suggestions, nothing written
    (tmp_path / "none.txt").write_text("NOT_TRAINED\n")
    argv[3] = str(tmp_path / "none.txt")
    with pytest.raises(ValueError, match="NOT_TRAINED"):
        inference_conditional([*argv, "--output_dir", str(tmp_path / "none")])
    assert not (tmp_path / "none").exists()


def test_evaluate_checks_genes_before_sampling_and_names_the_scripts_flags(
    tmp_path: Path,
) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    genes = [f"G{i}" for i in range(64)]
    test = _cells(tmp_path / "test.h5ad", ["GENE_A", "non-targeting"], 3, genes, "gene")
    argv = [
        "--experiment_dir",
        str(exp),
        "--perturbations",
        "GENE_A",
        "--evaluate",
        "--test_data_path",
        str(test),
        "--gene",
        "gene",
        "--num_samples_per_pert",
        "2",
        *FAST,
    ]
    run = runpy_script("inference_conditional.py", argv)
    assert run[0] == 2
    assert "--genes FILE (job scripts: GENES_FILE)" in run[1]
    assert "nothing was generated" in run[1]
    assert not (exp / "inference_results").exists()
    # with the genes named, it samples and evaluates, writing st3's metric files too
    (tmp_path / "genes.txt").write_text("\n".join(genes))
    assert inference_conditional([*argv, "--genes", str(tmp_path / "genes.txt")]) == 0
    results = exp / "inference_results"
    out = results / "generated_cells.h5ad"
    assert (results / "generated_cells_eval" / "metrics.json").is_file()
    st3_files = {p.name for p in (results / "generated_cells_eval").iterdir()}
    assert {"generation_metrics_aggregate.json", "generation_metrics_per_perturbation.json",
            "generation_metrics_per_perturbation.csv"} <= st3_files  # fmt: skip
    # rerun: the result exists, so it is evaluated as it is, not sampled again
    written = out.stat().st_mtime_ns
    shutil.rmtree(results / "generated_cells_eval")
    assert inference_conditional([*argv, "--genes", str(tmp_path / "genes.txt")]) == 0
    assert out.stat().st_mtime_ns == written
    assert (results / "generated_cells_eval" / "metrics.json").is_file()


def runpy_script(name: str, argv: list[str]) -> tuple[int, str]:
    """Run ``scripts/<name>`` in this process as ``python scripts/<name> ARGV`` would: (exit
    code, stderr)."""
    import contextlib
    import io

    err = io.StringIO()
    old = sys.argv
    sys.argv = [str(ROOT / "scripts" / name), *argv]
    try:
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(ROOT / "scripts" / name), run_name="__main__")
    finally:
        sys.argv = old
    return int(exit_.value.code or 0), err.getvalue()


def test_errors_name_the_scripts_own_flags(tmp_path: Path) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    code, err = runpy_script("inference_conditional.py", [
        "--experiment_dir", str(exp), "--num_samples_per_pert", "0", *FAST])  # fmt: skip
    assert code == 2 and "--num_samples_per_pert" in err and "cells_per_condition" not in err
    code, err = runpy_script("inference_generation.py", [
        "--experiment_dir", str(_experiment("tiny_mlm", tmp_path)), "--num_generate", "0",
        *FAST])  # fmt: skip
    assert code == 2 and "--num_generate" in err and "cells_per_condition" not in err


@pytest.mark.parametrize(
    "script", ["inference_generation.py", "infernce_generation.py", "inference_generation2.py"]
)
def test_every_published_name_of_the_unconditional_script_runs(tmp_path: Path, script: str) -> None:
    exp = _experiment("tiny_mlm", tmp_path)
    code, err = runpy_script(script, [f"EXPERIMENT_DIR={exp}", "NUM_GENERATE=2", "NUM_STEPS=2",
                                      "PRECISION=fp32", "SEED=3"])  # fmt: skip
    assert code == 0, err
    adata = anndata.read_h5ad(exp / "inference" / "generated_cells.h5ad")
    assert adata.n_obs == 2 and adata.uns["sedd"]["seed"] == 3


def test_dcm_config_keys_are_honoured(tmp_path: Path) -> None:
    """DCM's configs/perturb_seq_small.yaml: data.gene cytokine, control_name PBS,
    all_perturbations_file, inference.sampler analytic, inference.batch_size."""
    import yaml

    exp = _dcm_experiment(tmp_path)
    (tmp_path / "all_cytokines.txt").write_text("PBS\nIL6\nIL2\nIL10\nIFNG\n")
    (tmp_path / "test_cytokines.txt").write_text("IL10\nNOT_IN_TRAINING\n")
    config = tmp_path / "perturb_seq_small.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "SEDDPerturbationTransformerSmall"},
        "data": {"gene": "cytokine", "control_name": "PBS",
                 "all_perturbations_file": str(tmp_path / "all_cytokines.txt"),
                 "cond_labels_pt_path": str(tmp_path / "cytokines.pt")},
        "inference": {"num_steps": 2, "sampler": "analytic", "batch_size": 4,
                      "num_samples_per_pert": 2,
                      "perturbations_file": str(tmp_path / "test_cytokines.txt")},
    }))  # fmt: skip
    assert inference_conditional(["--config", str(config), "--experiment_dir", str(exp),
                                  "--precision", "fp32"]) == 0  # fmt: skip
    adata = anndata.read_h5ad(exp / "inference_results" / "generated_cells.h5ad")
    assert list(adata.obs["perturbation"]) == ["IL10", "IL10"]
    assert adata.uns["sedd"]["sampler"] == "analytic"
    assert "cytokine" in adata.obs.columns  # the training label column (args.json's gene)


def test_st3_perturbseq_flags_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    genes = [str(i) for i in range(64)]
    test = _cells(
        tmp_path / "test.h5ad", ["GENE_A", "GENE_B", "non-targeting"], 3, genes, "cytokine"
    )  # st3's --gene names the label column (DCM's data.gene: cytokine)
    argv = ["--experiment_dir", str(exp), "--data_path", str(test), "--gene", "cytokine",
            "--sampler", "euler", "--num_batches", "2", "--use_train_split", "--batch_size", "4",
            "--num_samples_per_pert", "2", *FAST]  # fmt: skip
    assert inference_perturbseq(argv) == 0
    err = capsys.readouterr().err
    assert "note: --num_batches: accepted" in err and "note: --use_train_split: accepted" in err
    out = exp / "perturbseq_inference_results"
    assert set(anndata.read_h5ad(out / "generated_cells.h5ad").obs["perturbation"]) == {
        "GENE_A", "GENE_B", "non-targeting"}  # fmt: skip
    assert json.loads((out / "distribution_metrics.json").read_text())["overall"]
    st3 = json.loads((out / "metrics.json").read_text())  # st3's keys, in st3's order
    assert list(st3) == ["exact_cell_match", "per_gene_accuracy", "mae_bins", "within_k",
                         "num_steps", "temperature", "num_cells", "checkpoint"]  # fmt: skip
    assert st3["num_cells"] == 6 and list(st3["within_k"]) == ["1", "3", "5", "10"]


def test_a_flags_value_that_looks_like_a_word_stays_its_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = _experiment("tiny_pert", tmp_path)
    monkeypatch.chdir(tmp_path)
    # a directory named RUN=1 after --output_dir is that flag's value, not a KEY=VALUE word
    argv = ["--experiment_dir", str(exp), "--output_dir", "RUN=1", "NUM_SAMPLES_PER_PERT=1",
            "--perturbations", "GENE_A", *FAST]  # fmt: skip
    assert inference_conditional(argv) == 0
    assert anndata.read_h5ad(tmp_path / "RUN=1" / "generated_cells.h5ad").n_obs == 1
