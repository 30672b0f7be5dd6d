"""Atomic writes leave nothing behind: a killed writer's temporary file is removed by the next
writer of the same path; a live writer's is not."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sedd.cli import main
from sedd.io.files import check_writable, remove_stale_temporaries, temporary_name


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_the_next_writer_removes_a_killed_writers_temporary(tmp_path: Path) -> None:
    out = tmp_path / "merged.h5ad"
    host = socket.gethostname().replace(".", "_")
    stale = tmp_path / f".merged.h5ad.{host}.{_dead_pid()}.0a1b2c3d.tmp"
    live = tmp_path / f".merged.h5ad.{host}.{os.getpid()}.0a1b2c3d.tmp"
    other_host = tmp_path / f".merged.h5ad.elsewhere.{_dead_pid()}.0a1b2c3d.tmp"
    other_file = tmp_path / f".other.h5ad.{host}.{_dead_pid()}.0a1b2c3d.tmp"
    for path in (stale, live, other_host, other_file):
        path.write_bytes(b"half a file")
    fresh = temporary_name(out)
    assert not stale.exists()
    assert live.exists() and other_host.exists() and other_file.exists()
    assert fresh.name.startswith(f".merged.h5ad.{host}.{os.getpid()}.") and not fresh.exists()
    assert remove_stale_temporaries(tmp_path / "other.h5ad") == [other_file]


def test_check_writable_makes_the_directory_and_leaves_no_probe(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "cells.h5ad"
    assert check_writable(out) == out
    assert out.parent.is_dir() and list(out.parent.iterdir()) == []


def test_a_directory_or_a_device_as_the_output_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(IsADirectoryError, match="is a directory, not a file"):
        check_writable(tmp_path)
    with pytest.raises(FileExistsError, match="not a regular file"):
        check_writable(Path(os.devnull))
    assert main(["generate", "--num-cells", "1", "--steps", "1", "--out", str(tmp_path)]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()  # one line, before any sampling
    assert line.startswith(f"sedd generate: error: {tmp_path}: is a directory, not a file")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left
    assert Path(os.devnull).is_char_device()  # the device is still a device


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from server_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("files") / "tiny")


def _generate(model: Path, out: Path | str) -> list[str]:
    return ["generate", "--model", str(model), "--num-cells", "1", "--steps", "1",
            "--device", "cpu", "--precision", "fp32", "--out", str(out)]  # fmt: skip


def test_out_into_a_missing_directory_creates_it(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "dir" / "cells.h5ad"
    assert main([*_generate(tiny_model, out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["cells.h5ad", "cells.metrics.json"]
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_proc_as_the_output_directory_says_it_takes_no_new_files(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/proc answers "No such file or directory" to a new name; the directory is there."""
    refusal = "/proc exists but takes no new files (a virtual filesystem such as /proc or /sys)"
    assert main(_generate(tiny_model, "/proc/x.h5ad")) == 3
    assert capsys.readouterr().err == (
        f"sedd generate: error: /proc/x.h5ad: {refusal}; write to a directory on a disk; check "
        "the path and its permissions\n"
    )
    with pytest.raises(FileNotFoundError, match=re.escape(refusal)) as err:  # a directory to make
        check_writable(Path("/proc/sub/x.h5ad"))
    assert err.value.filename == "/proc/sub/x.h5ad"


@pytest.mark.parametrize("command", ["generate", "predict", "impute", "merge"])
def test_an_out_not_ending_in_h5ad_is_refused_before_the_model_loads(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "cells.csv"
    data = tmp_path / "counts.h5ad"
    data.write_bytes(b"")
    missing = tmp_path / "no_model"  # never read: the name is refused first
    argv = {
        "generate": ["generate", "--model", str(missing)],
        "predict": ["predict", "--model", str(missing)],
        "impute": ["impute", "--data", str(data), "--model", str(missing)],
        "merge": ["merge", str(tmp_path / "no_shards")],
    }[command]
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"sedd {command}: error: --out {out}: sedd writes AnnData .h5ad files only, so the name "
        f"must end in .h5ad (not '.csv'); pass e.g. --out {tmp_path / 'new' / 'cells.h5ad'}.\n"
    )
    assert not out.parent.exists()
