"""Files written so that a reader never sees half of one: atomic JSON, and content hashes."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import math
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sedd.io import output_lock


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_writable(path: Path) -> Path:
    """Create ``path``'s directory if needed and check that a file can be written there, so a
    command fails at once (with the path in the error) instead of after its work is done.

    An existing directory, device or other non-regular file at ``path`` is refused
    (``IsADirectoryError`` / ``FileExistsError``): the result would replace it."""
    if path.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            "is a directory, not a file: pass a file name such as DIR/cells.h5ad",
            str(path),
        )
    if path.exists() and not path.is_file():
        raise FileExistsError(
            errno.EEXIST,
            "exists and is not a regular file (a device, socket or pipe): pass a file name",
            str(path),
        )
    make_parents(path)
    probe = temporary_name(path)
    try:  # os.access says yes to root even on read-only filesystems: try for real
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileNotFoundError as err:
        raise _no_new_files(err, path.parent, path) from None
    except OSError as err:
        raise type(err)(err.errno, err.strerror, str(path.parent)) from None
    probe.unlink()
    return path


def _no_new_files(err: FileNotFoundError, directory: Path, path: Path) -> OSError:
    """``ENOENT`` from creating ``path`` in ``directory``: "No such file or directory" is wrong
    when the directory is there, as in /proc and /sys, which answer so to any new name."""
    if not directory.is_dir():  # really missing (removed meanwhile): the usual error
        return FileNotFoundError(err.errno, err.strerror, str(directory))
    return FileNotFoundError(
        err.errno,
        f"{directory} exists but takes no new files (a virtual filesystem such as /proc or "
        "/sys); write to a directory on a disk",
        str(path),
    )


_MADE: ContextVar[list[Path] | None] = ContextVar("sedd_made_directories", default=None)


def refuse_existing(path: Path, *, overwrite: bool, flag: str = "--overwrite") -> None:
    """``FileExistsError`` when ``path`` already holds a result and ``overwrite`` is off: checked
    before any work, so an earlier run's cells are never replaced by accident. Inside a CLI
    command this also claims ``path`` (``sedd.io.output_lock``): a second run writing it now is
    refused with ``OutputBusy``, before its work."""
    if output_lock.active() and not path.is_dir():
        make_parents(path)  # the lock file lies beside it
        output_lock.claim(path)
    if path.is_file() and not overwrite:  # a directory or device: check_writable says so
        raise FileExistsError(
            f"{path} exists (an earlier run's result); pass {flag} to replace it, or write "
            "somewhere else."
        )


def stale_records(out: Path) -> list[Path]:
    """The records beside ``out`` that describe the cells in it: ``<out>.metrics.json`` and an
    st3 ``generation_metadata.json`` whose ``output`` is ``out``. A command that replaces
    ``out`` removes them first, so no record outlives the cells it describes."""
    records = [out.with_suffix(".metrics.json")]
    for meta in (out.parent / "generation_metadata.json",
                 out.with_name(f"{out.stem}.generation_metadata.json")):  # fmt: skip
        try:
            named = json.loads(meta.read_text()).get("output")
        except (OSError, ValueError, AttributeError):
            continue
        if named is not None and Path(named).resolve() == out.resolve():
            records.append(meta)
    return [r for r in records if r.exists()]


def make_parents(path: Path) -> None:
    """Create the missing directories above ``path``; inside ``NewDirectories`` each one made
    here is noted, so that a run that fails can remove those it left empty."""
    missing = []
    for directory in (path.parent, *path.parent.parents):
        if directory.is_dir():
            break
        missing.append(directory)
    made = _MADE.get()
    for directory in reversed(missing):  # the outermost first
        try:
            directory.mkdir()
        except FileExistsError:  # made by another process meanwhile, or not a directory
            continue
        except FileNotFoundError as err:  # its parent is there: it takes no new entries
            raise _no_new_files(err, directory.parent, path) from None
        if made is not None:
            made.append(directory)
    path.parent.mkdir(parents=True, exist_ok=True)  # the usual error, where one is in the way


class NewDirectories:
    """The directories ``make_parents`` makes while this context is active (a CLI command):
    ``remove_empty()`` removes those left empty, the innermost first, and so does leaving the
    context with an error. A directory that was there before is never removed."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def __enter__(self) -> NewDirectories:
        self._token = _MADE.set(self.made)
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        _MADE.reset(self._token)
        if exc_type is not None:
            self.remove_empty()

    def remove_empty(self) -> None:
        for directory in reversed(self.made):
            with contextlib.suppress(OSError):  # not empty: something is in it, keep it
                directory.rmdir()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, then rename it into place, with the
    mode an ordinary new file gets (0644 under the usual umask 022)."""
    make_parents(path)
    with temporary_beside(path) as tmp:
        tmp.write_bytes(data)
        os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temporary name beside ``path``, then rename it into place."""
    make_parents(path)
    with temporary_beside(path) as tmp:
        tmp.write_text(json.dumps(_finite(obj), indent=2, default=str) + "\n")
        os.replace(tmp, path)


def _finite(obj: Any) -> Any:
    """NaN/Inf -> None: they are not JSON, and jq and most readers reject them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(value) for value in obj]
    return obj


def temporary_name(path: Path) -> Path:
    """A unique hidden name in ``path``'s directory (``os.replace`` must not cross filesystems).

    The name carries the host and process id, so the next writer of ``path`` can remove what a
    killed writer left behind (``remove_stale_temporaries``).
    """
    remove_stale_temporaries(path)
    host = socket.gethostname().replace(".", "_")
    return path.with_name(f".{path.name}.{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of earlier writers of ``path`` on this host whose process is
    gone (a killed ``sedd merge``); a live writer's file, or another host's, is left alone."""
    host = socket.gethostname().replace(".", "_")
    removed = []
    with contextlib.suppress(OSError):
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.{glob.escape(host)}.*.tmp"):
            pid = tmp.name[len(f".{path.name}.{host}.") :].split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


@contextlib.contextmanager
def temporary_beside(path: Path) -> Iterator[Path]:
    tmp = temporary_name(path)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
