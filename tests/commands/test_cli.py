"""The command line's front door: fast help, a version, close-flag suggestions, st3 spellings."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from sedd.cli import _parse, build_parser

COMMANDS = ["generate", "predict", "impute", "merge", "bench", "info", "convert", "evaluate",
            "quality", "train", "serve", "precision-report"]  # fmt: skip


def _imported(argv: list[str]) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sedd.cli", *argv],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    return {row.split(".")[0] for row in rows}


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in COMMANDS]])
def test_help_imports_no_torch(argv: list[str]) -> None:
    imported = _imported(argv)
    assert "sedd" in imported  # the measurement saw our own imports
    assert not {"torch", "numpy", "anndata", "scipy", "fastapi", "ray"} & imported


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        _parse(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"sedd {version('sedd')}"


def test_a_mistyped_flag_gets_the_commands_usage_and_the_closest_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        _parse(["generate", "--num-cels", "3", "--sed", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("usage: sedd generate ")
    assert err.rstrip().endswith(
        "error: unrecognized arguments: --num-cels 3 --sed 1; --num-cels: did you mean "
        "--num-cells?; --sed: did you mean --seed?"
    )


def test_st3_underscore_spellings_work_for_every_flag() -> None:
    args = _parse(["generate", "--num_steps", "7", "--num_cells=3", "--batch_size", "2",
                   "--perturbation_map", "m.json", "--tokens_per_forward", "9"])  # fmt: skip
    assert (args.steps, args.cells, args.batch_size) == (7, 3, 2)
    assert (args.perturbation_map, args.tokens_per_forward) == ("m.json", 9)


def test_no_flag_means_two_things() -> None:
    """--perturbations names perturbations (predict); the name -> index file is
    --perturbation-map in every command that loads a model."""
    _, commands = build_parser()
    for name, parser in commands.items():
        flags = {s: a for a in parser._actions for s in a.option_strings}
        if "--perturbations" in flags:
            assert name == "predict" and flags["--perturbations"].nargs == "+"
        if name in ("generate", "predict", "impute", "info", "convert", "precision-report"):
            assert flags["--perturbation-map"].dest == "perturbation_map"


def test_serve_help_lists_every_setting_with_its_variable_and_default() -> None:
    from server.config import Settings

    _, commands = build_parser()
    text = " ".join(commands["serve"].format_help().split())  # argparse wraps lines
    for name, field in Settings.model_fields.items():
        assert f"SEDD_{name.upper()}" in text, name
        if name not in ("api_key", "model"):
            shown = "none" if field.default is None else field.default
            assert f"SEDD_{name.upper()}, default {shown}" in text, name
    assert "--api-key" not in text  # a secret is never a flag
    args = _parse(
        ["serve", "--max-body-bytes", "2048", "--drain-timeout-s", "3", "--no-cuda-graphs"]
    )
    assert (args.max_body_bytes, args.drain_timeout_s, args.cuda_graphs) == (2048, 3.0, False)
    assert args.max_steps is None  # a flag left out leaves the environment's value


def test_help_says_each_default() -> None:
    _, commands = build_parser()
    text = " ".join(commands["bench"].format_help().split())
    assert "sampling steps (+1 final denoise) (default: 8)" in text
    assert "fp32 is the baseline (default: fp32 bf16)" in text
    assert "chunk k uses seed * 1000 + k (default: 0)" in text
    assert "(default: cuda if any)" in text and "(default: cuda if any) (default" not in text


def test_a_model_whose_output_overflows_is_a_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from server_models import save_tiny_model

    from sedd.cli import main

    model = save_tiny_model(tmp_path / "overflow", nan_label="BAD", overflow=True)
    out = tmp_path / "cells.h5ad"
    argv = ["generate", "--model", str(model), "--conditions", "BAD", "--cells", "1", "--steps",
            "2", "--precision", "fp32", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert line.startswith("sedd generate: error: model output is not finite for rows [0]")
    assert "No cells were written" in line and not out.exists()
