"""One writer per output file: a second `sedd` run into the same ``--out`` is refused at once.

Two runs into one destination used to both exit 0 with "wrote ...", the file holding the cells of
whichever renamed last. Inside ``OutputLocks`` (a CLI command), claiming a destination
(``sedd.io.files.refuse_existing``, which every command calls before its work) takes an
exclusive ``flock`` on a lock file beside it, ``.NAME.lock``, held until the command ends; a
process that finds it held gets ``OutputBusy`` naming the holder's pid. The kernel drops the lock
when its holder dies, however it dies (``scancel``, a time limit, ``kill -9``), so a lock never
outlives its run; the file is removed on release, and a claimant checks that the file it locked
is still the one at the path (a release may have removed it meanwhile).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from contextvars import ContextVar
from pathlib import Path


class OutputBusy(FileExistsError):
    """Another process holds the destination's lock: it is writing the same file now."""


_HELD: ContextVar[dict[Path, int] | None] = ContextVar("sedd_output_locks", default=None)


def lock_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def active() -> bool:
    """Inside ``OutputLocks``: a command that claims its outputs."""
    return _HELD.get() is not None


def claim(path: Path) -> None:
    """Lock ``path`` for the rest of the command (inside ``OutputLocks``; elsewhere, nothing).
    Raises ``OutputBusy`` when another process holds it. Claiming twice is once."""
    held = _HELD.get()
    if held is None:
        return
    key = path.absolute()
    if key in held:
        return
    lock = lock_name(key)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # no file can be made there: ``check_writable`` says why, in its words
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputBusy(
                f"{path} is being written by another sedd run ({holder}); wait for it to end, "
                "or write somewhere else"
            ) from None
        except OSError:
            os.close(fd)
            raise
        mine = os.fstat(fd)
        try:
            now = os.stat(lock)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)  # released and removed while we waited for it: take the new one
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}, since {started}".encode())
    held[key] = fd


def _release(path: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(lock_name(path))  # while still held: a claimant re-checks the inode
    os.close(fd)


class OutputLocks:
    """The destinations a command claims while this context is active (``claim``); all are
    released when it ends, however it ends."""

    def __enter__(self) -> OutputLocks:
        self._token = _HELD.set({})
        return self

    def __exit__(self, *exc: object) -> None:
        held = _HELD.get() or {}
        _HELD.reset(self._token)
        for path, fd in held.items():
            _release(path, fd)
