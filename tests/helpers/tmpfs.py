"""A small real filesystem for tests of full disks: a tmpfs mounted under the test's directory
(the test is skipped where none can be mounted: not root, or no permission)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(parent: Path, size: str, filler_bytes: int = 0) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"4m"``) at ``parent/tmpfs``, holding a ``filler`` file of
    ``filler_bytes`` when given; unmounted on exit."""
    mount = parent / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        if filler_bytes:
            (mount / "filler").write_bytes(b"\0" * filler_bytes)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
