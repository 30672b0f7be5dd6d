"""Generated cells as AnnData: the in-memory object the Python API returns and the .h5ad the CLI,
shard jobs and the server write (the same object, so the two never drift apart).

- ``cells_anndata``: counts (cells x genes, model gene order), ``obs`` per cell, ``uns`` provenance;
- ``write_cells_h5ad``: the same object written atomically (temp file + rename);
- ``provenance_uns``: what every output records about how it was made.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import os
import platform
import shutil
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anndata
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from anndata.io import sparse_dataset, write_elem

from sedd.io.files import make_parents, temporary_name
from sedd.io.guarded_file import GuardedFile
from sedd.io.read import as_counts, require_unique

CountDtype = Literal["int", "float32"]


def cells_anndata(
    counts: np.ndarray | sp.spmatrix | sp.sparray | torch.Tensor,
    genes: Sequence[str],
    obs: pd.DataFrame | Mapping[str, Any],
    uns: Mapping[str, Any],
    *,
    count_dtype: CountDtype = "int",
    var: pd.DataFrame | None = None,
    layers: Mapping[str, np.ndarray] | None = None,
) -> anndata.AnnData:
    """Cells x genes integer counts as AnnData.

    - ``var_names`` = ``genes`` (model order), with ``var``'s columns (indexed by ``genes``) when
      given; ``obs`` columns as given, strings as categoricals (a dict gets obs_names
      ``"0".."N-1"``);
    - counts as CSR int32 (int64 if the max needs it), whatever the gene count;
      ``count_dtype="float32"`` stores the same integer values as float32, for tools that
      normalise ``.X`` in place (Arc's cell-eval / pdex fail on integer matrices);
    - ``uns`` made writable: tuples -> lists, numpy/torch scalars -> Python; None stays None
      (h5ad stores it as null);
    - ``layers``: (cells, genes) real values each (e.g. the mean over draws), as CSR float32.
    """
    genes = [str(g) for g in genes]
    require_unique(genes, "genes")
    matrix = _count_matrix_for_writing(counts, n_genes=len(genes))
    if count_dtype == "float32":
        matrix = matrix.astype(np.float32)
    obs_frame = _obs_frame(obs, n_cells=matrix.shape[0])
    adata = anndata.AnnData(X=matrix, obs=obs_frame, var=_var_frame(genes, var))
    for name, values in (layers or {}).items():
        adata.layers[name] = _layer_for_writing(values, shape=matrix.shape)
    adata.uns.update(_writable_uns(dict(uns)))
    return adata


def write_cells_h5ad(
    path: str | Path,
    counts: np.ndarray | sp.spmatrix | sp.sparray | torch.Tensor,
    genes: Sequence[str],
    obs: pd.DataFrame | Mapping[str, Any],
    uns: Mapping[str, Any],
    *,
    compression: Literal["gzip", "lzf"] | None = "gzip",
    count_dtype: CountDtype = "int",
    var: pd.DataFrame | None = None,
    layers: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``cells_anndata(...)`` to ``path`` atomically and return the path: a temporary
    name in the same directory, then ``os.replace``."""
    path = Path(path)
    adata = cells_anndata(counts, genes, obs, uns, count_dtype=count_dtype, var=var, layers=layers)
    write_h5ad_atomic(adata, path, compression=compression)
    return path


def write_h5ad_atomic(
    adata: anndata.AnnData,
    path: Path,
    *,
    compression: Literal["gzip", "lzf"] | None = "gzip",
) -> None:
    """``adata.write_h5ad`` to a temporary name beside ``path``, then rename it into place."""
    make_parents(path)
    # a unique name in the same directory (os.replace must not cross filesystems); h5py creates
    # it, so the file gets the usual umask permissions
    tmp = temporary_name(path)
    try:
        adata.write_h5ad(tmp, compression=compression)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def provenance_uns(
    *,
    sampler: str,
    steps: int,
    seed: int,
    temperature: float,
    precision_record: Mapping[str, Any],
    checkpoint_hash: str,
    timings: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance to pass as ``uns``: ``{"sedd": {...}}``.

    Holds the sampler settings, the precision record (docs/precision.md rule 8), the checkpoint
    hash, timings, package versions and a UTC timestamp. No hostname or user is stored.
    ``extra`` adds keys (it may not overwrite the ones above).
    """
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}.")
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}.")
    record: dict[str, Any] = {
        "sampler": str(sampler),
        "steps": int(steps),
        "seed": int(seed),
        "temperature": float(temperature),
        "device": str(precision_record.get("device", "unknown")),
        "precision": dict(precision_record),
        "checkpoint_hash": str(checkpoint_hash),
        "timings": dict(timings),
        "versions": {
            **{name: _version(name) for name in ("sedd", "torch", "numpy", "anndata")},
            "python": platform.python_version(),
        },
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "tokens": "count c is token c (0..num_bins-1); the mask (num_bins) is never a count",
    }
    for key, value in (extra or {}).items():
        if key in record:
            raise ValueError(f"extra key {key!r} would overwrite a provenance field.")
        record[str(key)] = value
    return {"sedd": _writable_uns(record)}


def _var_frame(genes: list[str], var: pd.DataFrame | None) -> pd.DataFrame:
    frame = pd.DataFrame(index=pd.Index(genes, dtype=object))
    if var is None:
        return frame
    if list(var.index) != genes:  # a bug, not a user error
        raise ValueError("var must be indexed by the genes, in order.")
    for column in var.columns:
        frame[column] = var[column].to_numpy()
    return frame


def _count_matrix_for_writing(counts: Any, *, n_genes: int) -> sp.csr_matrix:
    if isinstance(counts, torch.Tensor):
        counts = counts.detach().cpu().numpy()
    matrix = as_counts(counts, where="counts", hint="pass integer counts")
    if matrix.ndim != 2 or matrix.shape[1] != n_genes:
        raise ValueError(
            f"counts must be (cells, {n_genes} genes) to match genes, got shape {matrix.shape}."
        )
    csr = sp.csr_matrix(matrix)  # CSR at any size: one layout for scanpy and for appends
    csr.eliminate_zeros()
    max_value = int(csr.data.max()) if csr.nnz else 0
    return sp.csr_matrix(csr, dtype=np.int32 if max_value < 2**31 else np.int64)


def _layer_for_writing(values: np.ndarray, *, shape: tuple[int, ...]) -> sp.csr_matrix:
    """A (cells, genes) layer of real values as CSR float32 (X's layout), zeros left out."""
    array = np.asarray(values, dtype=np.float32)
    if array.shape != tuple(shape):  # a bug, not a user error
        raise ValueError(f"a layer must be {tuple(shape)} like the counts, got {array.shape}.")
    csr = sp.csr_matrix(array)
    csr.eliminate_zeros()
    return csr


def _obs_frame(obs: pd.DataFrame | Mapping[str, Any], *, n_cells: int) -> pd.DataFrame:
    if isinstance(obs, pd.DataFrame):
        frame = obs.copy()
        if isinstance(frame.index, pd.RangeIndex):
            frame.index = pd.Index([str(i) for i in range(len(frame))], dtype=object)
        else:
            frame.index = pd.Index([str(i) for i in frame.index], dtype=object)
    else:
        frame = pd.DataFrame(
            dict(obs), index=pd.Index([str(i) for i in range(n_cells)], dtype=object)
        )
    if len(frame) != n_cells:
        raise ValueError(f"obs has {len(frame)} rows but counts has {n_cells} cells.")
    if not frame.index.is_unique:
        raise ValueError("obs index (obs_names) must be unique.")
    frame.columns = [str(c) for c in frame.columns]
    for column in frame.columns:
        series = frame[column]
        if isinstance(series.dtype, pd.CategoricalDtype):
            continue
        if pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series):
            frame[column] = series.map(str).astype("category")
    return frame


def _writable_uns(value: Any) -> Any:
    """Convert a provenance value into types anndata can write to h5ad."""
    match value:
        case None | bool() | str():
            return value
        case int() | float():
            return value
        case np.generic():
            return value.item()
        case np.ndarray():
            return value if value.dtype != object else [_writable_uns(v) for v in value.tolist()]
        case torch.Tensor():
            return _writable_uns(value.detach().cpu().numpy())
        case Mapping():
            return {str(k).replace("/", "_"): _writable_uns(v) for k, v in value.items()}
        case list() | tuple():
            items = [_writable_uns(v) for v in value]
            if any(isinstance(v, dict) for v in items):
                return {str(i): v for i, v in enumerate(items)}
            if any(isinstance(v, list | np.ndarray) for v in items):
                try:
                    array = np.array(items)
                except ValueError:  # ragged: keep every element, keyed by position
                    return {str(i): v for i, v in enumerate(items)}
                return array if array.dtype != object else {str(i): v for i, v in enumerate(items)}
            if any(v is None for v in items):  # h5ad arrays hold no null: key by position
                return {str(i): v for i, v in enumerate(items)}
            numeric = all(isinstance(v, int | float) for v in items)
            if not numeric and not all(isinstance(v, str) for v in items):
                return [str(v) for v in items]  # mixed: h5ad stores a list with one dtype
            return items
        case _:
            return str(value)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


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
            raise self._write_failed(self._sink.error) from exc
        if self._sink.error is not None:
            raise self._write_failed(self._sink.error)

    def _write_failed(self, err: OSError) -> OSError:
        return OSError(err.errno, f"{err.strerror or err} while writing the cells", str(self.path))

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
