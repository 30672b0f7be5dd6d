"""AnnData in: integer counts in the model's gene order (the way out is ``sedd.io.write``).

- ``read_counts``: an AnnData whose ``.X`` is integer counts, from ``.X``, a layer, or recovered
  from log-normalised ``.raw.X`` (scanpy's pbmc68k_reduced layout).
- ``align_genes``: columns reordered to the model's gene list.
- ``read_h5ad_safely``: ``anndata.read_h5ad`` after ``sedd.io.hdf5_safety`` has checked that
  the file holds its own data; every product read of an ``.h5ad`` goes through it.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import anndata
import numpy as np
import scipy.sparse as sp

from sedd.io.hdf5_safety import check_self_contained

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
    what: str = "h5ad file",
) -> anndata.AnnData:
    """Return an AnnData whose ``.X`` is integer counts (CSR int64 or dense int64).

    - default: ``.X`` must already hold non-negative integers (any numeric dtype);
    - ``layer="counts"``: take ``.layers["counts"]``;
    - ``recover="pbmc"``: ``round(expm1(raw.X) * obs[size_factor_key] / 1e4)``, for data stored
      as ``log1p(counts / size * 1e4)`` in ``.raw.X``; ``var`` then comes from ``.raw.var``. The
      largest rounding distance is recorded in ``uns["count_recovery"]``.

    ``obs``, ``var``, ``obsm`` and ``uns`` are kept (copies); the input is not modified. A path
    is read with ``read_h5ad_safely``; ``what`` names it in its errors (e.g. ``"--data"``).
    """
    adata = _load(source, what)
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
            counts = as_counts(adata.X, where=".X", hint=_recovery_hint(adata))
        case None:
            if layer not in adata.layers:
                raise ValueError(
                    f"layer {layer!r} not found; available layers: {_layer_list(adata)}. "
                    "Use layer=None to read .X."
                )
            counts = as_counts(
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
    require_unique(genes, "the model's gene list")
    var_names = [str(g) for g in adata.var_names]
    require_unique(var_names, "the data's var_names")
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


# --- reading -------------------------------------------------------------------------------


def read_h5ad_safely(
    path: str | Path, *, what: str = "h5ad file", backed: Literal["r"] | None = None
) -> anndata.AnnData:
    """``anndata.read_h5ad(path, backed=backed)``, once ``check_self_contained`` has found no
    object that reads another file (external storage or links, virtual datasets).

    ``what`` names the file in the errors (a flag such as ``"--data"``): ``ExternalDataError``
    for such an object, ``NotHdf5Error`` for a file that is not HDF5, both ``ValueError``."""
    check_self_contained(path, what)
    return anndata.read_h5ad(path, backed=backed)


def _load(source: str | Path | anndata.AnnData, what: str) -> anndata.AnnData:
    if isinstance(source, anndata.AnnData):
        return source
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no such h5ad file: {path}")
    with warnings.catch_warnings():
        # older files keep graphs in uns["neighbors"]; anndata moves them and says so
        warnings.filterwarnings("ignore", message="Moving element from .uns", category=Warning)
        return read_h5ad_safely(path, what=what)


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


COUNT_CEILING = 2**31 - 1  # counts are stored as int32; no read count comes near


def as_counts(matrix: Any, *, where: str, hint: str) -> np.ndarray | sp.csr_matrix:
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
    if np.issubdtype(values.dtype, np.complexfloating):
        raise ValueError(
            f"{where} holds complex numbers (dtype {values.dtype}); counts are real: pass the "
            "counts themselves."
        )
    if values.size:
        flat = values.reshape(-1)
        finite = np.isfinite(flat)
        huge = finite & (np.abs(flat) > COUNT_CEILING)
        if huge.any():
            raise ValueError(
                f"{where} is not counts: {int(huge.sum())} stored values are above "
                f"{COUNT_CEILING:.4g} (largest {np.nanmax(np.abs(flat)):.4g}), more than any "
                "read count; pass the raw counts."
            )
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


def require_unique(names: list[str], what: str) -> None:
    if len(set(names)) != len(names):
        duplicates = sorted(name for name, n in Counter(names).items() if n > 1)
        raise ValueError(
            f"{what} must be unique; duplicated: {duplicates[:10]}"
            f"{' ...' if len(duplicates) > 10 else ''}."
        )
