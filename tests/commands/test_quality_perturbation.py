"""``sedd quality --model M`` on a perturbation model: the perturbation report, run as the
``sedd evaluate --perturbation`` command it prints; without held-out cells of its perturbations,
a one-line error naming that command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from server_models import GENES, save_tiny_model

pytest.importorskip("scanpy")
pytest.importorskip("igraph")

from sedd.cli import main

# real cells per label and split; the 40 training cells fit the report's PCA
CELLS = {("ctrl", "test"): 12, ("KRAS", "test"): 10, ("TP53", "test"): 8, ("ctrl", "train"): 40}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("quality_pert")
    model = save_tiny_model(root / "tiny")
    keys = [key for key, n in CELLS.items() for _ in range(n)]
    obs = pd.DataFrame(
        {"perturbation": [k[0] for k in keys], "split": [k[1] for k in keys]},
        index=[f"c{i}" for i in range(len(keys))],
    )
    rng = np.random.default_rng(0)
    counts = rng.poisson(2.0, size=(len(keys), len(GENES))).astype(np.float32)
    ad.AnnData(X=counts, obs=obs, var=pd.DataFrame(index=GENES)).write_h5ad(root / "real.h5ad")
    return model, root / "real.h5ad"


def test_a_perturbation_model_gets_the_perturbation_report(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, real = files
    out = tmp_path / "q"
    argv = ["quality", "--model", str(model), "--real", str(real), "--steps", "2", "--seeds", "3"]
    assert main([*argv, "--precision", "fp32", "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    words = ["sedd", "evaluate", "--perturbation", "--model", str(model), "--real", str(real)]
    words += ["--control-label", "ctrl", "--split-key", "split", "--split-value", "test"]
    words += ["--steps", "2", "--device", "cpu", "--seed", "0", "--precision", "fp32"]
    command = shlex.join([*words, "--out-dir", str(out)])
    assert f"{model} is a perturbation model (control 'ctrl')" in printed
    assert f"`{command}`" in " ".join(printed.split())  # rich wraps long lines
    assert "not used by the perturbation report: --seeds" in printed
    assert "perturbation report (2 perturbations" in printed
    summary = json.loads((out / "summary_metrics.json").read_text())
    assert summary["n_perturbations"] == 2 and summary["inputs"]["model"] == str(model)
    assert summary["inputs"]["held_out"] == {"key": "split", "value": "test"}
    assert summary["inputs"]["real_cells_used"] == 30  # the test split only
    assert (out / "count_table.json").is_file() and not (out / "quality.json").exists()


def test_a_perturbation_model_on_the_bundled_cells_names_the_command_to_run(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, _ = files
    out = tmp_path / "q"
    assert main(["quality", "--model", str(model), "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    words = ["sedd", "evaluate", "--perturbation", "--model", str(model)]
    words += ["--real", "HELD_OUT.h5ad", "--control-label", "ctrl", "--out-dir", str(out)]
    command = shlex.join(words)
    assert len(err) == 1
    assert err[0].startswith(f"sedd quality: error: {model} is a perturbation model (control")
    assert f"run {command} (or pass --real HELD_OUT.h5ad here)." in err[0]
    assert not out.exists()
