"""A nearly full disk (a small tmpfs): ``sedd generate`` and ``sedd merge`` exit 3 with one line,
before any sampling where they can, and leave no file behind. HDF5 meeting a full disk mid-write
can end the process with a segfault, so the writer checks the free space first. Skipped where a
tmpfs cannot be mounted (not root, or no mount permission)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from checkpoint_files import ST3
from tmpfs import mounted_tmpfs

from sedd.cli import main

TINY = str(ST3 / "tiny_mlm")
pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")


@pytest.fixture
def nearly_full(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path, "4m", filler_bytes=3 * 2**20) as mount:  # about 1 MiB left
        yield mount


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    [line] = [x for x in capsys.readouterr().err.splitlines() if " error: " in x]
    return line


def test_generate_on_a_nearly_full_disk_exits_3_before_sampling(
    nearly_full: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = nearly_full / "run" / "cells.h5ad"
    argv = ["generate", "--model", TINY, "--num-cells", "2000", "--steps", "10", "--out", str(out)]
    assert main(argv) == 3
    line = _one_error(capsys)
    assert line.startswith(f"sedd generate: error: {out.parent}: No space left on device")
    assert "Free some space, or write to another disk" in line
    assert not out.parent.exists()  # no file, no temporary, no directory made for it


def test_merge_to_a_nearly_full_disk_exits_3_and_leaves_nothing(
    nearly_full: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    for shard in ("0", "1"):
        argv = ["generate", "--model", TINY, "--num-cells", "4", "--steps", "2", "--out-dir",
                str(run), "--num-shards", "2", "--shard-index", shard]  # fmt: skip
        assert main(argv) == 0
    capsys.readouterr()
    out = nearly_full / "merged" / "cells.h5ad"
    assert main(["merge", str(run), "--out", str(out)]) == 3
    assert _one_error(capsys).startswith(f"sedd merge: error: {out.parent}: No space left")
    assert not out.parent.exists()
