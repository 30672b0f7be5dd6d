"""The CLI's one-line errors, each through a real ``sedd`` command: faults of the input
(a NaN weight, a config nested 100,000 deep, dimensions of terabytes) exit 2, and what the
operating system refuses (``/proc``, ``/sys``, a path under a file) exits 3, before any
sampling. Every error is one line on stderr, with no traceback (docs/cli.md, "Errors and exit
codes").

The commands run in one CLI process shared by the module (``_Cli``), whose every command writes
its stderr to its own file."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_models import save_tiny_model

from sedd.defaults import DEFAULT_MODEL


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "SEDD_DEBUG": "", **extra}


# The shared CLI process: for each JSON line [argv, stderr file] on stdin it runs
# ``sedd.cli.main(argv)`` (as ``python -m sedd.cli`` does) with file descriptors 1 and 2 sent to
# /dev/null and that file, then answers the exit code on stdout. Whatever it writes outside a
# command (at start or exit) goes to its own stderr, which must stay empty.
_CLI_WORKER = """
import json, os, sys, traceback
from sedd.cli import main

def run(argv, err_path):
    sys.argv = ["sedd", *argv]
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.devnull, "wb") as out, open(err_path, "wb") as err:
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            return main(argv)
        except SystemExit as exc:
            return exc.code
        except BaseException:
            traceback.print_exc()
            return 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])

for line in sys.stdin:
    print(json.dumps(run(*json.loads(line))), flush=True)
"""


class _Cli:
    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, 0
        self.own_stderr = root / "worker.stderr"
        with self.own_stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CLI_WORKER], env=_env(), text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip

    def run(self, argv: list[str], timeout: float = 120) -> tuple[int, str]:
        """(exit code, stderr) of ``sedd ARGV``."""
        assert self.proc.poll() is None, self.own_stderr.read_text()
        self.calls += 1
        err = self.root / f"command-{self.calls}.stderr"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([argv, str(err)]) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            self.proc.kill()
            raise AssertionError(f"sedd {' '.join(argv)} did not finish in {timeout} s")
        answer = self.proc.stdout.readline()
        assert answer, f"the CLI process died: {self.own_stderr.read_text()}"
        return json.loads(answer), err.read_text()

    def close(self) -> str:
        """Stop the process; returns what it wrote outside its commands."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return self.own_stderr.read_text()


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cli]:
    worker = _Cli(tmp_path_factory.mktemp("cli"))
    yield worker
    assert worker.close() == ""  # nothing at start-up or exit either


def _one_line_failure(cli: _Cli, argv: list[str], code: int) -> str:
    returncode, stderr = cli.run(argv)
    assert returncode == code, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
def test_serve_refuses_a_checkpoint_with_a_nan_weight_in_one_line(
    cli: _Cli, tmp_path: Path
) -> None:
    model = save_tiny_model(tmp_path / "nan", nan_label="BAD")
    line = _one_line_failure(cli, ["serve", "--model", str(model), "--port", "1"], 2)
    assert line.startswith("sedd serve: error: ")
    assert "non-finite weights (NaN or Inf) in pert_embed.weight" in line


def test_generate_to_an_impossible_path_is_one_line_before_sampling(cli: _Cli) -> None:
    argv = ["generate", "--num-cells", "1", "--steps", "1", "--out", "/proc/nope/x.h5ad"]
    line = _one_line_failure(cli, argv, 3)
    assert line == (  # /proc refuses any new name with ENOENT: say what it is instead
        "sedd generate: error: /proc/nope/x.h5ad: /proc exists but takes no new files (a virtual "
        "filesystem such as /proc or /sys); write to a directory on a disk; check the path and "
        "its permissions"
    )


def test_a_config_nested_100k_deep_is_one_line(cli: _Cli, tmp_path: Path) -> None:
    model = tmp_path / "deep"
    model.mkdir()
    (model / "config.json").write_text('{"schema_version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (model / "model.safetensors").write_bytes((DEFAULT_MODEL / "model.safetensors").read_bytes())
    line = _one_line_failure(cli, ["info", str(model)], 2)
    assert line.endswith("config.json is nested too deeply to be a config; fix or replace it.")


def test_huge_config_dimensions_are_refused_before_allocating(cli: _Cli, tmp_path: Path) -> None:
    model = tmp_path / "huge"
    model.mkdir()
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config["arch"]["hidden_dim"] = 1 << 16  # the ceiling: terabytes of weights if allocated
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    line = _one_line_failure(cli, ["info", str(model)], 2)
    assert "shape mismatch for 'token_embed.weight': expected (261, 65536)" in line


@pytest.fixture(scope="module")
def sharded_run(cli: _Cli, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("merge") / "run"
    argv = ["generate", "--num-cells", "1", "--steps", "1", "--conditions", "CD19+ B"]
    code, stderr = cli.run([*argv, "--out-dir", str(out_dir)])
    assert code == 0, stderr
    return out_dir


@pytest.mark.parametrize("target", ["under-a-file/x.h5ad", "/sys/x.h5ad"])
def test_merge_to_an_unwritable_place_is_one_line(
    cli: _Cli, tmp_path: Path, sharded_run: Path, target: str
) -> None:
    (tmp_path / "under-a-file").write_text("a file, not a directory")
    out = target if target.startswith("/") else str(tmp_path / target)
    line = _one_line_failure(cli, ["merge", str(sharded_run), "--out", out], 3)
    assert line.startswith(f"sedd merge: error: {Path(out).parent}: ")
    assert line.endswith("; check the path and its permissions")
