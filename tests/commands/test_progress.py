"""Progress bars only where someone watches: every command that draws them takes
``--progress/--no-progress``, and without either it draws them only when stderr is a terminal,
so SLURM ``.out`` files and logs get the summary and log lines, not a bar redrawn per update."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import anndata
import numpy as np
import pytest
import scipy.sparse as sp
from server_models import save_tiny_model

from sedd.cli import build_parser, main
from sedd.commands.args import show_progress

BAR_COMMANDS = ["generate", "predict", "impute", "train"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("progress") / "tiny")


def _generate(model: Path, out: Path, *flags: str) -> list[str]:
    return ["generate", "--model", str(model), "--num-cells", "2", "--steps", "2", "--device",
            "cpu", "--precision", "fp32", "--out", str(out), *flags]  # fmt: skip


@pytest.mark.parametrize("command", BAR_COMMANDS)
def test_each_command_that_draws_bars_takes_progress_and_no_progress(command: str) -> None:
    _, commands = build_parser()
    parser = commands[command]
    [action] = [a for a in parser._actions if "--progress" in a.option_strings]
    assert isinstance(action, argparse.BooleanOptionalAction)
    assert action.option_strings == ["--progress", "--no-progress"]
    base = ["--data", "x.h5ad"] if command == "impute" else []
    flags = ([], ["--progress"], ["--no-progress"])
    assert [parser.parse_args([*base, *f]).progress for f in flags] == [
        None,
        True,
        False,
    ]
    text = " ".join(parser.format_help().split())
    assert "(default: only when stderr is a terminal, so none in SLURM .out files or logs)" in text


def test_show_progress_is_as_asked_else_whether_stderr_is_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a file, not a terminal
    assert (show_progress(None), show_progress(True), show_progress(False)) == (False, True, False)
    monkeypatch.setattr(sys, "stderr", type("Tty", (), {"isatty": lambda self: True})())
    assert (show_progress(None), show_progress(False)) == (True, False)


def test_no_bar_into_a_file_unless_asked(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_generate(tiny_model, tmp_path / "a.h5ad")) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out.startswith(f"wrote {tmp_path / 'a.h5ad'}: 10 cells")
    assert main(_generate(tiny_model, tmp_path / "b.h5ad", "--progress")) == 0
    assert "sampling: 100%" in capsys.readouterr().err


def test_a_bar_on_a_terminal_unless_told_not_to(
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the captured stderr, a terminal
    assert main(_generate(tiny_model, tmp_path / "a.h5ad")) == 0
    assert "sampling: 100%" in capsys.readouterr().err
    assert main(_generate(tiny_model, tmp_path / "b.h5ad", "--no-progress")) == 0
    assert capsys.readouterr().err == ""


def test_train_into_a_log_prints_its_lines_but_no_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    counts = sp.csr_matrix(rng.poisson(1.5, size=(12, 6)).astype(np.int32))
    data = tmp_path / "cells.h5ad"
    anndata.AnnData(X=counts).write_h5ad(data)
    config = tmp_path / "train.json"
    settings = {"data": str(data), "arch": {"hidden_dim": 16, "num_layers": 1, "num_heads": 2},
                "batch_size": 4, "max_steps": 2, "warmup_steps": 1, "log_every": 1,
                "condition_key": None, "split_key": None, "val_split": None,
                "device": "cpu"}  # fmt: skip
    config.write_text(json.dumps(settings))
    argv = ["train", "--config", str(config), "--out", str(tmp_path / "model")]
    assert main(argv) == 0
    done = capsys.readouterr()
    assert done.err == ""
    lines = done.out.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["step 1/2", "step 2/2"]
    assert lines[-1].startswith("trained steps 1..2 in ")
