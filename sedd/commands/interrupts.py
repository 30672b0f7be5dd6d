"""SIGTERM as a clean stop, for ``sedd`` and st3's scripts alike.

``scancel`` and a SLURM time limit send SIGTERM (then SIGKILL after a grace period). Python's
default ends the process at once, leaving a half-written ``.NAME.h5ad.*.tmp`` and printing
nothing (exit 143). Here SIGTERM raises ``Terminated`` in the main thread, as Ctrl-C raises
``KeyboardInterrupt``: the same clean-up runs (partial files removed, output locks released,
finished shard batches kept), one line is printed, and the exit code stays 143.
"""

from __future__ import annotations

import signal
import threading

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread was (see the module docstring)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def terminate_cleanly() -> None:
    """Turn SIGTERM into ``Terminated`` from now on (the main thread only: Python runs signal
    handlers there)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def terminated_line(who: str) -> str:
    return (
        f"{who}: terminated (SIGTERM): stopped cleanly, no partial file left; finished shard "
        "batches are kept, so the same command resumes"
    )
