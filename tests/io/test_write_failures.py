"""A write that fails half-way (a file-size limit, a disk that fills after the free-space check)
ends ``sedd generate`` with exit 3 and one line naming the file and the cause; nothing is left
behind: no temporary file, no partial output, no empty directory the run created for ``--out``.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anndata
import numpy as np
import pytest
from checkpoint_files import ST3
from tmpfs import mounted_tmpfs

from sedd.cli import main
from sedd.io.write import write_cells_h5ad

TINY = str(ST3 / "tiny_mlm")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")


def _generate(out: Path, cells: int = 200) -> list[str]:
    """``sedd generate`` of the tiny st3 model: 200 cells make a file of about 40 kB."""
    return ["generate", "--model", TINY, "--num-cells", str(cells), "--steps", "2",
            "--device", "cpu", "--precision", "fp32", "--out", str(out)]  # fmt: skip


def _cli(
    argv: list[str], preexec_fn: Callable[[], None] | None = None, code: str = ""
) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process (``code`` runs first, in that process)."""
    script = f"{code}\nfrom sedd.cli import main\nraise SystemExit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, preexec_fn=preexec_fn)  # fmt: skip


def _one_error(stderr: str) -> str:
    """The one error line (the progress bar and warnings may share stderr); no traceback."""
    assert "Traceback" not in stderr and "HDF5-DIAG" not in stderr, stderr[-3000:]
    [line] = [x for x in stderr.splitlines() if " error: " in x]
    return line[line.index("sedd ") :]  # after the progress bar's last carriage return


@pytest.mark.slow
def test_a_file_size_limit_mid_write_exits_3_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "cells.h5ad"

    def limit() -> None:  # 20 kB: past the free-space check, inside the cells' writing
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))

    done = _cli(_generate(out), preexec_fn=limit)
    assert done.returncode == 3, (done.returncode, done.stderr[-3000:])
    line = _one_error(done.stderr)
    assert line.startswith(f"sedd generate: error: {out}: File too large"), line
    assert "nothing was written there" in line and "ulimit -f" in line
    assert list(tmp_path.iterdir()) == []  # no cells, no temporary, no metrics


def _full_after(budget: int) -> Callable[..., int]:
    """``os.pwrite`` that writes ``budget`` bytes in all, then part of one more call, then
    fails as a disk that another process filled does."""
    real, left = os.pwrite, [budget]

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real(fd, memoryview(data)[: left[0]], offset)
        left[0] -= written
        return written

    return pwrite


def test_a_disk_that_fills_mid_write_exits_3_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cells.h5ad"
    monkeypatch.setattr(os, "pwrite", _full_after(10_000))
    assert main(_generate(out)) == 3
    line = _one_error(capsys.readouterr().err)
    assert line.startswith(f"sedd generate: error: {out}: No space left on device"), line
    assert "nothing was written there. Free some space, or write to another disk" in line
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (skipped where none can be mounted: not root, or no permission)."""
    with mounted_tmpfs(tmp_path, "4m") as mount:
        yield mount


@pytest.mark.slow
def test_a_real_disk_that_fills_after_the_check_exits_3_and_leaves_nothing(
    small_disk: Path,
) -> None:
    """Another process fills the disk after the free-space check: the check is switched off
    here, so that HDF5 meets the full disk itself."""
    (small_disk / "filler").write_bytes(b"\0" * (4 * 2**20 - 60_000))
    out = small_disk / "cells.h5ad"
    skip_check = (
        "from sedd.io.cell_writer import CellWriter\nCellWriter._ensure_space = lambda *_: None"
    )
    done = _cli(_generate(out, cells=400), code=skip_check)
    assert done.returncode == 3, (done.returncode, done.stderr[-3000:])
    line = _one_error(done.stderr)
    assert line.startswith(f"sedd generate: error: {out}: No space left on device"), line
    assert [p.name for p in small_disk.iterdir()] == ["filler"]


def test_a_directory_made_for_out_is_removed_when_a_refused_run_leaves_it_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from server_models import save_tiny_model

    model = save_tiny_model(tmp_path / "overflow", nan_label="BAD", overflow=True)
    out = tmp_path / "new" / "deeper" / "cells.h5ad"
    argv = ["generate", "--model", str(model), "--conditions", "BAD", "--cells", "1", "--steps",
            "2", "--precision", "fp32", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert "No cells were written" in _one_error(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()  # both directories the run made
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main([*argv[:-1], str(kept / "cells.h5ad")]) == 2
    assert kept.is_dir()  # a directory that was there before is not the run's to remove


def test_a_directory_made_for_out_is_removed_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwrite", _full_after(10_000))
    assert main(_generate(tmp_path / "new" / "cells.h5ad")) == 3
    assert list(tmp_path.iterdir()) == []


def _small_cells(path: Path) -> Path:
    """``write_cells_h5ad`` (the server's .h5ad answers): 300 cells, about 60 kB."""
    rng = np.random.default_rng(0)
    genes = [f"g{i}" for i in range(50)]
    return write_cells_h5ad(path, rng.integers(0, 9, (300, 50)), genes, {}, {"sedd": {}})


def test_write_cells_h5ad_raises_a_disk_that_fills_mid_write_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "cells.h5ad"
    monkeypatch.setattr(os, "pwrite", _full_after(5_000))
    with pytest.raises(OSError) as caught:
        _small_cells(out)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(out)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert anndata.read_h5ad(_small_cells(out)).shape == (300, 50)  # the same call, with room


def test_write_cells_h5ad_past_a_file_size_limit_raises_efbig_instead_of_crashing(
    tmp_path: Path,
) -> None:
    """Without the guard, HDF5 meets the refused write itself and the process can die (139)."""
    out = tmp_path / "cells.h5ad"
    code = (
        "import errno, pathlib, resource, signal, numpy as np\n"
        "from sedd.io.write import write_cells_h5ad\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8_000, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    write_cells_h5ad(\n"
        f"        pathlib.Path({str(out)!r}), np.random.default_rng(0).integers(0, 9, (300, 50)),\n"
        "        [f'g{i}' for i in range(50)], {}, {'sedd': {}})\n"
        "except OSError as err:\n"
        "    print('errno', errno.errorcode[err.errno], err.filename)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip() == f"errno EFBIG {out}"
    assert list(tmp_path.iterdir()) == []


# the writer pauses after its first cells are written: a SIGTERM then lands mid-write
_PAUSE_MID_WRITE = """
import time
from sedd.io.cell_writer import CellWriter
_add = CellWriter.add
def add(self, counts):
    _add(self, counts)
    print("writing", flush=True)
    time.sleep(60)
CellWriter.add = add
"""


@pytest.mark.slow
def test_sigterm_mid_write_leaves_nothing_says_so_in_one_line_and_exits_143(
    tmp_path: Path,
) -> None:
    """What ``scancel`` and a SLURM time limit send: it used to leave ``.NAME.h5ad.*.tmp`` and
    print nothing (exit 143). Now the same clean-up as Ctrl-C runs, and one line says so."""
    out = tmp_path / "cells.h5ad"
    script = (
        f"{_PAUSE_MID_WRITE}\nfrom sedd.cli import main\nraise SystemExit(main({_generate(out)!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # mid-write
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    [line] = [x for x in stderr.splitlines() if "terminated" in x]
    assert line.endswith(
        "sedd generate: terminated (SIGTERM): stopped cleanly, no partial file left; finished "
        "shard batches are kept, so the same command resumes"
    )
    assert list(tmp_path.iterdir()) == []  # no cells, no temporary, no lock, no metrics
