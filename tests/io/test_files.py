"""Atomic writes leave nothing behind: a killed writer's temporary file is removed by the next
writer of the same path; a live writer's is not."""

from __future__ import annotations

import os
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
