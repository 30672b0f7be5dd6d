"""One writer per ``--out`` (issue "Hardening, round 5", item 2): ``sedd generate`` A (20 cells)
and B (started 0.5 s later) into the same ``--out`` both exited 0 with "wrote same.h5ad", and the
file held A's cells only. Now B is refused at once, in one line naming A's pid, and A's cells
are what the file holds; a lock dies with its process."""

from __future__ import annotations

import contextvars
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anndata as ad
import pytest

from sedd.cli import main
from sedd.io.output_lock import OutputBusy, OutputLocks, claim, lock_name

SEDD = [sys.executable, "-m", "sedd.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "SEDD_DEBUG": ""}


def _claim_elsewhere(path: Path) -> None:
    """``claim`` as another command would (its own ``OutputLocks``, in a fresh context)."""

    def other() -> None:
        with OutputLocks():
            claim(path)

    contextvars.Context().run(other)


def test_a_claimed_output_is_refused_to_another_claimant_until_released(tmp_path: Path) -> None:
    out = tmp_path / "cells.h5ad"
    with OutputLocks():
        claim(out)
        claim(out)  # the same command again: once
        assert lock_name(out).is_file()
        assert f"pid {os.getpid()}" in lock_name(out).read_text()
        with pytest.raises(OutputBusy, match=r"cells.h5ad is being written by another sedd run"):
            _claim_elsewhere(out)
    assert not lock_name(out).exists()  # released and removed
    _claim_elsewhere(out)  # free again
    claim(out)  # outside a command: nothing is locked, nothing is left
    assert not lock_name(out).exists()


def test_a_command_holds_its_output_and_a_second_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "same.h5ad"
    with OutputLocks():
        claim(out)  # another run is writing it
        code = main(["generate", "--num-cells", "1", "--steps", "1", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "same.h5ad is being written by another sedd run (pid" in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_second_process_into_the_same_out_is_refused_and_the_first_ones_cells_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "same.h5ad"
    argv = [*SEDD, "generate", "--precision", "fp32", "--out", str(out)]
    first = subprocess.Popen([*argv, "--num-cells", "2", "--steps", "200", "--seed", "1"],
                             env=ENV, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not lock_name(out).exists():  # A has claimed it
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.05)
        second = subprocess.run([*argv, "--num-cells", "4", "--steps", "2", "--seed", "2"],
                                env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert first.poll() is None  # B was refused while A was still at work
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"(pid {first.pid} on " in lines[0] and "write somewhere else" in lines[0]
        first.send_signal(signal.SIGKILL)  # a lock dies with its process, however it dies
        first.wait(60)
        third = subprocess.run([*argv, "--num-cells", "3", "--steps", "2", "--seed", "3"],
                               env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    assert third.returncode == 0, third.stderr
    assert ad.read_h5ad(out).n_obs == 3 * 10  # the third run's cells (10 conditions)
    assert not lock_name(out).exists()
