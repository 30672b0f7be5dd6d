"""Merge the shards of an output directory into one h5ad, after checking nothing is missing.

Checks, in order, each failing with a message that says which shards and what to do:
``request.json`` present, with a sane shard count (1..``MAX_SHARDS``) and cell count; an entry
and an h5ad for every shard 0..n-1, each entry naming its own h5ad, a regular file (never a FIFO
or a device, which would block or never end); every entry written for this request; every h5ad
matching its entry's sha256; every shard holding exactly its cell range
(so no cell is missing or duplicated) and the total equal to the request's cell count; the same
genes everywhere. Only then is the output written (atomically). Merging twice gives the same cells.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import scipy.sparse as sp

from sedd.io.cell_writer import CellWriter
from sedd.io.files import sha256_file, write_json_atomic
from sedd.io.read import read_h5ad_safely
from sedd.io.write import COUNT_SCALE
from sedd.shards.manifest import (
    REQUEST_FILE,
    SHARD_DIR,
    ShardOutputError,
    ShardPaths,
    read_json,
    request_layout,
    shard_h5ad,
)
from sedd.shards.ranges import Shard, shard_range

_CHUNK_CELLS = 16384  # cells copied at a time
_ENTRY_NAME = re.compile(r"shard-([0-9]+)-of-[0-9]+\.json")


class MergeError(ShardOutputError):
    """The shards cannot be merged (missing, foreign, corrupt or overlapping)."""


def _indices(shards: list[int], total: int | None = None) -> str:
    """The first 20 shard numbers of ``shards`` (of ``total``, when it lists only the first)."""
    total = len(shards) if total is None else total
    more = f" and {total - 20} more" if total > 20 else ""
    return ", ".join(map(str, shards[:20])) + more


def _finished(out_dir: Path, n: int) -> set[int]:
    """The shards of ``n`` with both an entry and an h5ad, from one listing of the shards
    directory: the cost is the files there, not ``n`` (a million names to look up one by one
    take many seconds)."""
    shard_dir = out_dir / SHARD_DIR
    names = set(os.listdir(shard_dir)) if shard_dir.is_dir() else set()
    found = set()
    for name in names:
        match = _ENTRY_NAME.fullmatch(name)
        if match is None or int(match[1]) >= n:
            continue
        paths = ShardPaths(out_dir, Shard(int(match[1]), n))
        if name == paths.entry.name and paths.h5ad.name in names:  # of n shards, not another n
            found.add(paths.shard.index)
    return found


def _checked_entries(
    out_dir: Path, request: dict[str, Any], n: int, num_cells: int
) -> list[dict[str, Any]]:
    finished = _finished(out_dir, n)
    if len(finished) < n:
        missing = list(itertools.islice((k for k in range(n) if k not in finished), 20))
        raise MergeError(
            f"{n - len(finished)} of {n} shards are not finished in {out_dir / SHARD_DIR}: "
            f"shard(s) {_indices(missing, n - len(finished))} (no "
            f"{ShardPaths(out_dir, Shard(missing[0], n)).entry.name} or no h5ad). Rerun those "
            f"shards (e.g. sbatch --array={','.join(map(str, missing))}, or --shard-index K) "
            "with the same request, then merge again."
        )
    entries: list[dict[str, Any]] = []
    for k in range(n):
        paths = ShardPaths(out_dir, Shard(k, n))
        entries.append(read_json(paths.entry, "shard entry"))
        shard_h5ad(entries[-1], paths)  # named as the layout names it, and a regular file
    wanted = request["identity_sha256"]
    foreign = [k for k, e in enumerate(entries) if e.get("identity_sha256") != wanted]
    if foreign:
        raise MergeError(
            f"shard(s) {_indices(foreign)} in {out_dir} were written for a different request "
            f"than {out_dir / REQUEST_FILE}; delete them and rerun those shards."
        )
    corrupt = [
        k
        for k, e in enumerate(entries)
        if sha256_file(ShardPaths(out_dir, Shard(k, n)).h5ad) != e.get("h5ad_sha256")
    ]
    if corrupt:
        raise MergeError(
            f"shard(s) {_indices(corrupt)}: the h5ad does not match the sha256 in its entry "
            "(changed or damaged after it was written). Delete those shards' .json files and "
            "rerun them; a rerun regenerates them."
        )
    for k, e in enumerate(entries):
        expected = shard_range(num_cells, n, k)
        got = e.get("cell_range")
        if e.get("shard_index") != k or got != [expected.start, expected.stop]:
            raise MergeError(
                f"shard {k}'s entry covers cells {got} (index {e.get('shard_index')}), expected "
                f"[{expected.start}, {expected.stop}]: cells would be missing or duplicated. "
                f"Delete {ShardPaths(out_dir, Shard(k, n)).entry} and rerun shard {k}."
            )
    return entries


def merge_shards(
    out_dir: str | Path, out: str | Path, *, count_dtype: Literal["int", "float32"] = "int"
) -> dict[str, Any]:
    """Check and merge ``out_dir``'s shards into ``out``; returns the merge summary (also
    written to ``<out>.metrics.json``)."""
    out_dir, out = Path(out_dir), Path(out)
    request_path = out_dir / REQUEST_FILE
    if not request_path.exists():
        raise MergeError(
            f"{request_path} not found: {out_dir} is not a sharded output directory (written by "
            "`sedd generate/predict --out-dir DIR`), or no shard has started yet."
        )
    request = read_json(request_path, "request file")
    n, num_cells = request_layout(request, request_path)  # checked before any shard is looked at
    entries = _checked_entries(out_dir, request, n, num_cells)

    paths = [ShardPaths(out_dir, Shard(k, n)).h5ad for k in range(n)]
    shard0 = read_h5ad_safely(paths[0], what="shard 0", backed="r")
    genes, first_uns = [str(g) for g in shard0.var_names], dict(shard0.uns.get("sedd", {}))
    shard0.file.close()
    summary = _summary(out, entries, request)
    uns_record = {key: value for key, value in first_uns.items() if key != "shard"}
    uns_record["timings"] = summary["timings"]
    uns_record["merged_from"] = {
        "out_dir": str(out_dir),
        "num_shards": n,
        "identity_sha256": request["identity_sha256"],
        "shard_sha256": [e["h5ad_sha256"] for e in entries],
    }
    with CellWriter(out, genes, count_dtype=count_dtype) as writer:
        frames = [_copy_shard(k, path, entries[k], genes, writer) for k, path in enumerate(paths)]
        obs = pd.concat([f for f in frames if len(f)] or frames[:1])  # empty shards add no rows
        duplicated = obs.index[obs.index.duplicated()].unique().tolist()
        if duplicated:
            raise MergeError(f"cells appear in more than one shard: {duplicated[:5]}.")
        if len(obs) != num_cells:
            raise MergeError(f"the shards hold {len(obs)} cells, the request has {num_cells}.")
        writer.finish(obs, {"sedd": uns_record})
    write_json_atomic(out.with_suffix(".metrics.json"), summary)
    return summary


def _copy_shard(
    k: int, path: Path, entry: dict[str, Any], genes: list[str], writer: CellWriter
) -> pd.DataFrame:
    """Append shard ``k``'s cells to ``writer`` in row chunks (never the whole shard in memory);
    return its obs."""
    adata = read_h5ad_safely(path, what=f"shard {k}", backed="r")
    try:
        if adata.n_obs != entry["cells"]:
            raise MergeError(
                f"shard {k}'s h5ad holds {adata.n_obs} cells, its entry says {entry['cells']}."
            )
        if [str(g) for g in adata.var_names] != genes:
            raise MergeError(f"shard {k} has other genes than shard 0; rerun shard {k}.")
        for lo in range(0, adata.n_obs, _CHUNK_CELLS):
            writer.add(sp.csr_matrix(adata.X[lo : lo + _CHUNK_CELLS]))
        return adata.obs.copy()
    finally:
        adata.file.close()


def _summary(out: Path, entries: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    timings = [e.get("timings", {}) for e in entries]

    def total(key: str) -> float:
        return float(sum(t.get(key) or 0 for t in timings))

    seconds = total("seconds")
    cells = sum(int(e["cells"]) for e in entries)
    return {
        "output": str(out),
        "scale": COUNT_SCALE,  # what the merged file's .X holds
        "cells": cells,
        "shards": len(entries),
        "timings": {
            "shard_seconds_total": seconds,
            "forwards": int(total("forwards")),
            "fp32_fallbacks": int(total("fp32_fallbacks")),
            "peak_memory_mib_max": max((t.get("peak_memory_mib") or 0 for t in timings), default=0),
        },
        "precision": entries[0].get("precision") if entries else None,
        "identity_sha256": request["identity_sha256"],
        "request": request["identity"],
    }
