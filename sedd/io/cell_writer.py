"""``CellWriter``: generated cells appended to one .h5ad batch by batch, so a run of any size
holds one batch in memory; the same file layout ``sedd.io.write.cells_anndata`` gives."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from anndata.io import sparse_dataset, write_elem

from sedd.io.files import make_parents, temporary_name
from sedd.io.guarded_file import GuardedFile
from sedd.io.read import require_unique
from sedd.io.write import (
    CountDtype,
    _count_matrix_for_writing,
    _layer_for_writing,
    _obs_frame,
    _var_frame,
    _writable_uns,
    write_failed,
)

_FLUSH_NNZ = 1 << 19  # counts buffered before one append (4 MiB of int32 data + indices)


_SPACE_MARGIN = 2 * 2**20  # HDF5's metadata, chunk rewrites and the close


class CellWriter:
    """Cells written to one .h5ad as they come, so a run of any size holds one batch at a time.

    ``X`` is CSR on disk and grows with each ``add`` (anndata's ``sparse_dataset(...).append``);
    each of ``layers`` (names) the same way with each ``add_layer`` (CSR float32, as
    ``cells_anndata`` writes layers), and must have as many rows as ``X`` at the end;
    ``finish(obs, uns)`` writes the annotations and renames the temporary file into place, so
    the path never holds half a file. Use as a context manager: an error removes the temp file.
    A write the OS refuses (a full disk, a file-size limit) raises ``OSError`` naming ``path``
    at the step it happens in, and the temporary file is removed.
    """

    def __init__(
        self,
        path: str | Path,
        genes: Sequence[str],
        *,
        count_dtype: CountDtype = "int",
        var: pd.DataFrame | None = None,
        layers: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.genes = [str(g) for g in genes]
        require_unique(self.genes, "genes")
        self.dtype = np.float32 if count_dtype == "float32" else np.int32
        self.cells = 0
        self.layers = tuple(str(name) for name in layers)
        # per element ("X", "layers/<name>"): batches not yet written (at most _FLUSH_NNZ), rows
        elements = ["X", *(f"layers/{name}" for name in self.layers)]
        self._buffers: dict[str, list[sp.csr_matrix]] = {key: [] for key in elements}
        self._buffered_nnz = dict.fromkeys(elements, 0)
        self._rows = dict.fromkeys(elements, 0)
        make_parents(self.path)
        self._tmp = temporary_name(self.path)
        self._ensure_space(0)  # before any sampling: a full disk is refused at once
        self._sink = GuardedFile(self._tmp)
        try:
            self._file = h5py.File(self._sink, "w")
            with self._checked():
                self._file.attrs["encoding-type"] = "anndata"
                self._file.attrs["encoding-version"] = "0.1.0"
                write_elem(self._file, "var", _var_frame(self.genes, var))
                if self.layers:
                    write_elem(self._file, "layers", {})
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> CellWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:
            self.abort()

    def add(self, counts: np.ndarray | sp.spmatrix | sp.sparray | torch.Tensor) -> None:
        """Append (B, G) counts (dense or sparse, non-negative integers)."""
        matrix = _count_matrix_for_writing(counts, n_genes=len(self.genes))
        self._append("X", sp.csr_matrix(matrix, dtype=self.dtype))
        self.cells += matrix.shape[0]

    def add_layer(self, name: str, values: np.ndarray) -> None:
        """Append (B, G) real values to the layer ``name`` (one of ``layers``)."""
        if name not in self.layers:  # a bug, not a user error
            raise ValueError(f"layer {name!r} was not named when the writer was made.")
        rows = np.shape(values)[0]
        self._append(f"layers/{name}", _layer_for_writing(values, shape=(rows, len(self.genes))))

    def _append(self, key: str, csr: sp.csr_matrix) -> None:
        self._buffers[key].append(csr)
        self._buffered_nnz[key] += csr.nnz
        self._rows[key] += csr.shape[0]
        if self._buffered_nnz[key] >= _FLUSH_NNZ:
            with self._checked():
                self._flush(key)

    def _flush(self, key: str) -> None:
        """Write the buffered batches of ``key`` as one append: appends to a compressed dataset
        rewrite its last chunk, so many small ones would cost time that grows with the file."""
        buffer = self._buffers[key]
        if not buffer and key in self._file:
            return
        dtype = self.dtype if key == "X" else np.float32
        csr = (
            sp.vstack(buffer, format="csr", dtype=dtype)
            if buffer
            else (sp.csr_matrix((0, len(self.genes)), dtype=dtype))
        )
        self._buffers[key], self._buffered_nnz[key] = [], 0
        self._ensure_space(csr.data.nbytes + csr.indices.nbytes + 8 * (csr.shape[0] + 1))
        if key in self._file:
            sparse_dataset(self._file[key]).append(csr)
            return
        write_elem(self._file, key, csr, dataset_kwargs={"compression": "gzip"})
        group = self._file[key]  # a 64-bit indptr: a million cells can hold > 2**31 counts
        indptr = group["indptr"][...].astype(np.int64)
        del group["indptr"]
        group.create_dataset("indptr", data=indptr, maxshape=(None,), chunks=True)

    def finish(self, obs: pd.DataFrame | Mapping[str, Any], uns: Mapping[str, Any]) -> Path:
        """Write ``obs`` (one row per cell added) and ``uns``, close and rename into place."""
        for key, rows in self._rows.items():
            if rows != self.cells:  # a bug, not a user error
                raise ValueError(f"{key} has {rows} rows for {self.cells} cells.")
        with self._checked():
            for key in self._buffers:
                self._flush(key)
            frame = _obs_frame(obs, n_cells=self.cells)
            self._ensure_space(int(frame.memory_usage(deep=True).sum()))
            write_elem(self._file, "obs", frame)
            write_elem(self._file, "uns", _writable_uns(dict(uns)))
            self._file.close()  # HDF5 writes what it still holds: checked before the rename
            self._sink.close()
        os.replace(self._tmp, self.path)
        return self.path

    @contextlib.contextmanager
    def _checked(self) -> Iterator[None]:
        """Raise a write the OS refused in the block as ``OSError`` naming ``path``, in place of
        whatever HDF5 made of the writes dropped after it."""
        try:
            yield
        except Exception as exc:
            if self._sink.error is None:
                raise
            raise write_failed(self._sink.error, self.path) from exc
        if self._sink.error is not None:
            raise write_failed(self._sink.error, self.path)

    def _ensure_space(self, needed: int) -> None:
        """Refuse (``OSError`` ENOSPC, naming the directory) to write ``needed`` bytes, plus
        room for the file's own metadata, where the disk has less free: a full disk is then
        found before the work, not after it (one that fills later is ``GuardedFile``'s)."""
        free = shutil.disk_usage(self._tmp.parent).free
        if free < needed + _SPACE_MARGIN:
            raise OSError(
                errno.ENOSPC,
                f"No space left on device: writing the cells needs about "
                f"{(needed + _SPACE_MARGIN) / 2**20:.1f} MiB more, {free / 2**20:.1f} MiB free",
                str(self.path.parent),
            )

    def abort(self) -> None:
        """Close and remove the temporary file (nothing at ``path`` changes)."""
        try:
            file = getattr(self, "_file", None)
            if file is not None and file.id.valid:
                # the file is discarded: the error that brought us here is the one to report
                with contextlib.suppress(Exception):
                    file.close()
        finally:
            self._sink.close()
            self._tmp.unlink(missing_ok=True)
