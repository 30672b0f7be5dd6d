"""AnnData in and out: integer counts in the model's gene order, provenance in ``uns``.

- ``read_counts``: an AnnData whose ``.X`` is integer counts, from ``.X``, a layer, or recovered
  from log-normalised ``.raw.X`` (scanpy's pbmc68k_reduced layout).
- ``align_genes``: columns reordered to the model's gene list.
- ``write_cells_h5ad``: generated cells with gene names, obs labels and provenance, written
  atomically (a reader never sees a half-written file).
- ``provenance_uns``: the ``uns["sedd"]`` record (sampler, seed, precision, versions, timings).
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import platform
import uuid
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

# Recovered counts must sit this close to an integer; 0.5 would be pure noise. The pbmc68k
# file reaches 0.08 (float32 storage of log1p values), so 0.25 is strict yet unambiguous.
RECOVERY_TOLERANCE = 0.25
RECOVERY_SCALE = 1e4  # scanpy's normalize_total(target_sum=1e4)


class GeneAlignmentWarning(UserWarning):
    """Genes in the data that the model does not use were dropped."""


def read_counts(
    source: str | Path | anndata.AnnData,
    *,
    layer: str | None = None,
    recover: Literal["pbmc"] | None = None,
    size_factor_key: str = "n_counts",
) -> anndata.AnnData:
    """Return an AnnData whose ``.X`` is integer counts (CSR int64 or dense int64).

    - default: ``.X`` must already hold non-negative integers (any numeric dtype);
    - ``layer="counts"``: take ``.layers["counts"]``;
    - ``recover="pbmc"``: ``round(expm1(raw.X) * obs[size_factor_key] / 1e4)``, for data stored
      as ``log1p(counts / size * 1e4)`` in ``.raw.X``; ``var`` then comes from ``.raw.var``. The
      largest rounding distance is recorded in ``uns["count_recovery"]``.

    ``obs``, ``var``, ``obsm`` and ``uns`` are kept (copies); the input is not modified.
    """
    adata = _load(source)
    if layer is not None and recover is not None:
        raise ValueError(
            f"pass either layer={layer!r} or recover={recover!r}, not both: a layer is read as "
            "counts, recovery rebuilds counts from .raw.X."
        )
    var = adata.var
    match recover:
        case None if layer is None:
            if adata.X is None:
                raise ValueError(
                    "this AnnData has no .X; pass layer=... "
                    f"(available layers: {_layer_list(adata)})."
                )
            counts = _as_counts(adata.X, where=".X", hint=_recovery_hint(adata))
        case None:
            if layer not in adata.layers:
                raise ValueError(
                    f"layer {layer!r} not found; available layers: {_layer_list(adata)}. "
                    "Use layer=None to read .X."
                )
            counts = _as_counts(
                adata.layers[layer], where=f"layer {layer!r}", hint=_recovery_hint(adata)
            )
        case "pbmc":
            counts, max_error = _recover_pbmc(adata, size_factor_key)
            var = adata.raw.var
        case _:
            raise ValueError(f"recover must be None or 'pbmc', got {recover!r}.")
    out = anndata.AnnData(
        X=counts,
        obs=adata.obs.copy(),
        var=var.copy(),
        obsm={key: value.copy() for key, value in adata.obsm.items()},
        uns=copy.deepcopy(dict(adata.uns)),
    )
    if recover is not None:
        out.uns["count_recovery"] = {
            "method": recover,
            "formula": f"round(expm1(raw.X) * obs['{size_factor_key}'] / 1e4)",
            "max_abs_rounding_error": max_error,
        }
    return out


def align_genes(adata: anndata.AnnData, genes: Sequence[str]) -> anndata.AnnData:
    """Reorder columns to the model's gene order (a copy).

    Missing genes raise ``ValueError`` naming up to 10 of them; genes the model does not use
    are dropped with a ``GeneAlignmentWarning``.
    """
    genes = [str(g) for g in genes]
    _require_unique(genes, "the model's gene list")
    var_names = [str(g) for g in adata.var_names]
    _require_unique(var_names, "the data's var_names")
    present = set(var_names)
    missing = [g for g in genes if g not in present]
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ValueError(
            f"{len(missing)} of the model's {len(genes)} genes are missing from the data: "
            f"{missing[:10]}{more}. The data must contain every model gene (var_names must use "
            "the same identifiers, e.g. symbols vs Ensembl IDs)."
        )
    wanted = set(genes)
    extra = [g for g in var_names if g not in wanted]
    if extra:
        warnings.warn(
            f"dropping {len(extra)} gene(s) the model does not use, e.g. {extra[:5]}.",
            GeneAlignmentWarning,
            stacklevel=2,
        )
    if var_names == genes:
        return adata.copy()
    return adata[:, genes].copy()


def write_cells_h5ad(
    path: str | Path,
    counts: np.ndarray | sp.spmatrix | sp.sparray | torch.Tensor,
    genes: Sequence[str],
    obs: pd.DataFrame | Mapping[str, Any],
    uns: Mapping[str, Any],
    *,
    compression: Literal["gzip", "lzf"] | None = "gzip",
    count_dtype: Literal["int", "float32"] = "int",
) -> Path:
    """Write cells x genes integer counts to ``path`` atomically and return the path.

    - ``var_names`` = ``genes`` (model order); ``obs`` columns as given, strings as categoricals
      (a dict gets obs_names ``"0".."N-1"``);
    - counts as int32 (int64 if the max needs it), CSR when smaller than dense;
      ``count_dtype="float32"`` stores the same integer values as float32, for tools that
      normalise ``.X`` in place (Arc's cell-eval / pdex fail on integer matrices);
    - ``uns`` made writable: None -> "None", tuples -> lists, numpy/torch scalars -> Python.
    The file is written to a temporary name in the same directory, then ``os.replace``d.
    """
    path = Path(path)
    genes = [str(g) for g in genes]
    _require_unique(genes, "genes")
    matrix = _count_matrix_for_writing(counts, n_genes=len(genes))
    if count_dtype == "float32":
        matrix = matrix.astype(np.float32)
    obs_frame = _obs_frame(obs, n_cells=matrix.shape[0])
    adata = anndata.AnnData(
        X=matrix, obs=obs_frame, var=pd.DataFrame(index=pd.Index(genes, dtype=object))
    )
    adata.uns.update(_writable_uns(dict(uns)))
    path.parent.mkdir(parents=True, exist_ok=True)
    # a unique name in the same directory (os.replace must not cross filesystems); h5py creates
    # it, so the file gets the usual umask permissions
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        adata.write_h5ad(tmp, compression=compression)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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


# --- reading -------------------------------------------------------------------------------


def _load(source: str | Path | anndata.AnnData) -> anndata.AnnData:
    if isinstance(source, anndata.AnnData):
        return source
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no such h5ad file: {path}")
    with warnings.catch_warnings():
        # older files keep graphs in uns["neighbors"]; anndata moves them and says so
        warnings.filterwarnings("ignore", message="Moving element from .uns", category=Warning)
        return anndata.read_h5ad(path)


def _layer_list(adata: anndata.AnnData) -> str:
    names = list(adata.layers.keys())
    return str(names) if names else "none"


def _recovery_hint(adata: anndata.AnnData) -> str:
    hints = []
    if len(adata.layers):
        hints.append(f"read a counts layer with layer=... (available: {_layer_list(adata)})")
    if adata.raw is not None:
        hints.append(
            "if .raw.X holds log1p(counts / n_counts * 1e4) (scanpy's pbmc68k_reduced), pass "
            "recover='pbmc' (CLI: --recover pbmc)"
        )
    if not hints:
        hints.append("this file has no counts layer and no .raw; supply raw UMI counts")
    return "; or ".join(hints)


def _as_counts(matrix: Any, *, where: str, hint: str) -> np.ndarray | sp.csr_matrix:
    """Integer-valued matrix -> CSR int64 or dense int64; anything else -> ValueError."""
    if sp.issparse(matrix):
        csr = sp.csr_matrix(matrix, copy=True)
        csr.sum_duplicates()
        values = csr.data
    else:
        csr = None
        values = np.asarray(matrix)
    if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.number):
        raise ValueError(f"{where} must be numeric counts, got dtype {values.dtype}.")
    if values.size:
        flat = values.reshape(-1)
        finite = np.isfinite(flat)
        negative = finite & (flat < 0)
        fractional = finite & (flat != np.round(flat))
        n_bad = int((~finite | negative | fractional).sum())
        if n_bad:
            raise ValueError(
                f"{where} is not integer counts: {n_bad} of {values.size} stored values are "
                f"negative, non-integer or non-finite (min {np.nanmin(flat):.4g}, e.g. "
                f"{flat[np.flatnonzero(~finite | negative | fractional)[0]]:.4g}). The data "
                f"look log-normalised or scaled. To get counts: {hint}."
            )
    if csr is not None:
        csr.data = csr.data.astype(np.int64)
        return csr
    return values.astype(np.int64)


def _recover_pbmc(adata: anndata.AnnData, size_factor_key: str) -> tuple[sp.csr_matrix, float]:
    if adata.raw is None:
        raise ValueError(
            "recover='pbmc' needs .raw.X = log1p(counts / size * 1e4), but this AnnData has "
            "no .raw."
        )
    if size_factor_key not in adata.obs:
        raise ValueError(
            f"recover='pbmc' needs per-cell size factors in obs[{size_factor_key!r}]; "
            f"obs columns are {list(adata.obs.columns)}. Pass size_factor_key=..."
        )
    size = adata.obs[size_factor_key].to_numpy(dtype=np.float64)
    if not (np.isfinite(size).all() and (size > 0).all()):
        raise ValueError(f"obs[{size_factor_key!r}] must be finite and > 0 for every cell.")
    # float64 before expm1: raw.X is usually float32 and the scale-up amplifies its rounding
    csr = sp.csr_matrix(adata.raw.X, dtype=np.float64, copy=True)
    csr.sum_duplicates()
    rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    values = np.expm1(csr.data) * size[rows] / RECOVERY_SCALE
    if values.size and not np.isfinite(values).all():
        raise ValueError("recover='pbmc': .raw.X holds NaN/Inf values.")
    rounded = np.round(values)
    max_error = float(np.abs(values - rounded).max()) if values.size else 0.0
    if max_error > RECOVERY_TOLERANCE or (rounded < 0).any():
        raise ValueError(
            f"recover='pbmc' did not give integer counts (max |x - round(x)| = {max_error:.3f} > "
            f"{RECOVERY_TOLERANCE}): .raw.X is not log1p(counts / obs[{size_factor_key!r}] * "
            "1e4). Check size_factor_key, or read counts from a layer."
        )
    csr.data = rounded.astype(np.int64)
    csr.eliminate_zeros()
    return csr, max_error


# --- writing -------------------------------------------------------------------------------


def _count_matrix_for_writing(counts: Any, *, n_genes: int) -> np.ndarray | sp.csr_matrix:
    if isinstance(counts, torch.Tensor):
        counts = counts.detach().cpu().numpy()
    matrix = _as_counts(counts, where="counts", hint="pass integer counts")
    if matrix.ndim != 2 or matrix.shape[1] != n_genes:
        raise ValueError(
            f"counts must be (cells, {n_genes} genes) to match genes, got shape {matrix.shape}."
        )
    if sp.issparse(matrix):
        max_value = int(matrix.data.max()) if matrix.nnz else 0
        nnz = matrix.nnz
    else:
        max_value = int(matrix.max()) if matrix.size else 0
        nnz = int(np.count_nonzero(matrix))
    dtype = np.int32 if max_value < 2**31 else np.int64
    n_cells = matrix.shape[0]
    index_bytes = 4 if max(n_genes, nnz) < 2**31 else 8
    sparse_bytes = nnz * (np.dtype(dtype).itemsize + index_bytes) + (n_cells + 1) * 8
    dense_bytes = n_cells * n_genes * np.dtype(dtype).itemsize
    if sparse_bytes < dense_bytes:
        csr = matrix if sp.issparse(matrix) else sp.csr_matrix(matrix)
        csr.eliminate_zeros()
        return sp.csr_matrix(csr, dtype=dtype)
    dense = matrix.toarray() if sp.issparse(matrix) else matrix
    return np.ascontiguousarray(dense, dtype=dtype)


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
        case None:
            return "None"
        case bool() | str():
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
            numeric = all(isinstance(v, int | float) for v in items)
            if not numeric and not all(isinstance(v, str) for v in items):
                return [str(v) for v in items]  # mixed: h5ad stores a list with one dtype
            return items
        case _:
            return str(value)


def _require_unique(names: list[str], what: str) -> None:
    if len(set(names)) != len(names):
        duplicates = sorted(name for name, n in Counter(names).items() if n > 1)
        raise ValueError(
            f"{what} must be unique; duplicated: {duplicates[:10]}"
            f"{' ...' if len(duplicates) > 10 else ''}."
        )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
