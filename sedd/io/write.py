"""Generated cells as AnnData: the in-memory object the Python API returns and the .h5ad the CLI,
shard jobs and the server write (the same object, so the two never drift apart).

- ``cells_anndata``: counts (cells x genes, model gene order), ``obs`` per cell, ``uns`` provenance;
- ``write_cells_h5ad``: the same object written atomically (temp file + rename);
- ``provenance_uns``: what every output records about how it was made.

``sedd.io.cell_writer.CellWriter`` writes the same layout batch by batch, for runs of any size.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anndata
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch
from anndata.io import write_elem

from sedd.io.files import make_parents, temporary_name
from sedd.io.guarded_file import GuardedFile
from sedd.io.read import as_counts, require_unique

CountDtype = Literal["int", "float32"]
# The scale of every matrix sedd writes (.X and the mean-of-draws layer): raw counts, never
# normalised; the evaluation reports say "log1p_cp10k" where they normalise.
COUNT_SCALE = "counts"


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
    """``adata`` as ``.h5ad`` to a temporary name beside ``path``, then renamed into place.

    HDF5 writes through a ``GuardedFile``: a write the OS refuses part-way (a full disk, a
    file-size limit) is raised as ``OSError`` naming ``path`` and the temporary file is
    removed, instead of HDF5 ending the process at its next step."""
    make_parents(path)
    # a unique name in the same directory (os.replace must not cross filesystems)
    tmp = temporary_name(path)
    sink = GuardedFile(tmp)
    try:
        try:
            with h5py.File(sink, "w") as file:
                write_elem(file, "/", adata, dataset_kwargs={"compression": compression})
        except Exception as exc:
            if sink.error is None:
                raise
            raise write_failed(sink.error, path) from exc
        sink.close()
        if sink.error is not None:
            raise write_failed(sink.error, path)
        os.replace(tmp, path)
    finally:
        sink.close()
        tmp.unlink(missing_ok=True)


def write_failed(err: OSError, path: Path) -> OSError:
    """A write the OS refused, as the error to report: its cause, naming ``path``."""
    return OSError(err.errno, f"{err.strerror or err} while writing the cells", str(path))


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

    Holds the scale of the values (``"scale": "counts"``), the sampler settings, the precision
    record (docs/precision.md rule 8), the checkpoint hash, timings, package versions and a UTC
    timestamp. No hostname or user is stored.
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
        # what .X holds, said outright: tools that guess (cell-eval) may take counts for log1p
        "scale": COUNT_SCALE,
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
