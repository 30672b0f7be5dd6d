"""A file for HDF5 to write through that never lets it meet a refused write.

HDF5 (through h5py) handles an ``ENOSPC`` or ``EFBIG`` from the OS badly: h5py swallows the
error and HDF5 can end the process with a segfault at its next step. ``GuardedFile`` is handed to
h5py's ``fileobj`` driver instead of a file name; it keeps the first refused write and drops the
rest, so ``sedd.io.cell_writer.CellWriter`` can raise it cleanly and remove the temporary file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


class GuardedFile:
    """The temporary file as HDF5 writes it (h5py's ``fileobj`` driver), so that HDF5 never
    meets a write the OS refuses: after one (a full disk, a file-size limit), HDF5 can end the
    process with a segfault at its next step instead of raising.

    The first refused write is kept in ``error`` and every later write is dropped; the writer
    checks ``error`` after each step and then discards the file.
    """

    def __init__(self, path: Path) -> None:
        self.error: OSError | None = None
        self._position = 0
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            offset += self._position
        elif whence == os.SEEK_END:
            offset += os.fstat(self._open()).st_size
        self._position = offset
        return offset

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: memoryview) -> int:
        """Read at the position; past the end of the file, zeros (as HDF5's own driver)."""
        view = memoryview(buffer).cast("B")
        done = os.preadv(self._open(), [view], self._position)
        view[done:] = bytes(len(view) - done)
        self._position += len(view)
        return len(view)

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = os.fstat(self._open()).st_size - self._position
        data = os.pread(self._open(), size, self._position)
        self._position += len(data)
        return data

    def write(self, data: bytes | memoryview) -> int:
        """Write all of ``data`` at the position; a refused write is kept in ``error``, and
        HDF5 is told it was written."""
        view = memoryview(data).cast("B")
        self._attempt(lambda: self._write_all(view, self._position))
        self._position += len(view)
        return len(view)

    def truncate(self, size: int) -> int:
        self._attempt(lambda: os.ftruncate(self._open(), size))
        return size

    def flush(self) -> None:
        """Nothing is buffered here: each write went to the OS."""

    def close(self) -> None:
        """Free the descriptor (even after a refused write); an error closing is kept."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.close(fd)
        except OSError as err:
            self.error = self.error or err

    def _write_all(self, view: memoryview, offset: int) -> None:
        """``pwrite`` until all of ``view`` is written (the OS may write part of it a call)."""
        done = 0
        while done < len(view):
            done += os.pwrite(self._open(), view[done:], offset + done)

    def _open(self) -> int:
        if self._fd is None:
            raise ValueError("the temporary file is closed.")
        return self._fd

    def _attempt(self, operation: Callable[[], object]) -> None:
        """Run ``operation`` unless a write was refused already; keep the ``OSError`` it
        raises instead of raising it."""
        if self.error is not None:
            return
        try:
            operation()
        except OSError as err:
            self.error = err
