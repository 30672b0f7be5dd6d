"""The files of a sharded output directory, and the records that tie them to one request.

::

    DIR/request.json                         the request (written once; a different one is refused)
    DIR/shards/shard-00001-of-00004.h5ad     shard 1's cells (temp file + atomic rename)
    DIR/shards/shard-00001-of-00004.json     its manifest entry, written after the h5ad
    DIR/shards/shard-00001-of-00004.parts-<id>/cells-<start>-<stop>.npz
                                             finished batches of an unfinished shard

One entry file per shard, so concurrent array tasks never write the same file. An entry names the
request's identity hash; the identity holds everything that changes a cell's counts (request
parameters except the batch size, model weights hash, gene names, precision, device type) plus the
shard layout (cell count, shard count).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.engine.forwards import block_rows_for
from sedd.io.files import temporary_beside
from sedd.precision import PrecisionPolicy
from sedd.request.plan import GenerationRequest
from sedd.shards.ranges import MAX_SHARDS, Shard

FORMAT = "sedd-shards/1"
REQUEST_FILE = "request.json"
SHARD_DIR = "shards"


class ShardOutputError(ValueError):
    """The output directory holds results of another request, or is inconsistent."""


@dataclass(frozen=True)
class ShardPaths:
    """Where one shard's files live in ``out_dir``."""

    out_dir: Path
    shard: Shard

    @property
    def h5ad(self) -> Path:
        return self.out_dir / SHARD_DIR / f"{self.shard.stem}.h5ad"

    @property
    def entry(self) -> Path:
        return self.out_dir / SHARD_DIR / f"{self.shard.stem}.json"

    def parts_dir(self, identity_sha256: str) -> Path:
        # The identity in the name: parts of another request are never picked up.
        return self.out_dir / SHARD_DIR / f"{self.shard.stem}.parts-{identity_sha256[:16]}"


def _canonical_sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def request_identity(
    loaded: LoadedModel,
    request: GenerationRequest,
    precision: PrecisionPolicy,
    *,
    num_cells: int,
    num_shards: int,
    tokens_per_forward: int | None,
) -> dict[str, Any]:
    """Everything that decides the cells of each shard; equal identities give equal cells.
    ``tokens_per_forward`` as asked for (None: the device's default) stays under ``request``,
    where requests before it left the request recorded it, so their runs still resume."""
    if request.imputation is not None:
        raise ShardOutputError(
            "an imputation request writes one file: leave out --out-dir and the shard options."
        )
    params = request.record()
    params["tokens_per_forward"] = tokens_per_forward
    params["conditions"] = None if request.conditions is None else list(request.conditions)
    return {
        "request": params,
        "model_sha256": loaded.file_hash,
        "genes_sha256": _canonical_sha256(list(loaded.config.genes)),
        "block_rows": block_rows_for(loaded.config.num_genes, precision.device, tokens_per_forward),
        "amp_dtype": precision.name,
        "tf32": precision.tf32,
        "device_type": precision.device.type,
        "cells": num_cells,
        "num_shards": num_shards,
    }


def request_record(identity: Mapping[str, Any], **info: Any) -> dict[str, Any]:
    """The content of ``request.json``: the identity, its hash, and informational fields."""
    return {
        "format": FORMAT,
        "identity_sha256": _canonical_sha256(identity),
        "identity": dict(identity),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        **info,
    }


def read_json(path: Path, what: str) -> dict[str, Any]:
    regular_file(path, what)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ShardOutputError(f"{what} {path} is not valid JSON ({exc}); delete it.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ShardOutputError(f"{what} {path} is not a {FORMAT} record; delete it.")
    return data


def regular_file(path: Path, what: str) -> Path:
    """``path`` when it is a regular file (a link is followed). A FIFO, device, socket or
    directory is refused before anything opens it: reading a FIFO nobody writes blocks forever,
    reading /dev/zero never ends."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                 (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                 (stat.S_ISSOCK, "a socket"))  # fmt: skip
        kind = next((name for is_kind, name in kinds if is_kind(mode)), "a special file")
        link = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ShardOutputError(
            f"{what} {path} is {kind}{link}, not a regular file, so it is not read; delete it "
            "and rerun the shard(s) that write it."
        )
    return path


def request_layout(record: Mapping[str, Any], path: Path) -> tuple[int, int]:
    """(shard count, cell count) of the request record read from ``path``, checked: they decide
    how many files a merge looks for and how it splits the cells, so an edited or damaged record
    is one line naming the field, never a billion-shard loop or an empty range."""
    identity = record.get("identity")
    if not isinstance(identity, Mapping):
        raise _bad_field(path, "identity", identity, "a mapping")
    num_shards, cells = identity.get("num_shards"), identity.get("cells")
    if not _whole(num_shards) or not 1 <= num_shards <= MAX_SHARDS:
        wanted = f"a whole number in 1..{MAX_SHARDS:,}"
        raise _bad_field(path, "identity.num_shards", num_shards, wanted)
    if not _whole(cells) or cells < 0:
        raise _bad_field(path, "identity.cells", cells, "a whole number >= 0")
    if not isinstance(record.get("identity_sha256"), str):
        raise _bad_field(path, "identity_sha256", record.get("identity_sha256"), "a hex string")
    return num_shards, cells


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad_field(path: Path, field: str, value: Any, wanted: str) -> ShardOutputError:
    return ShardOutputError(
        f"request file {path}: {field} must be {wanted}, got {_short(value)}; the file was "
        "edited or damaged: restore it, or rerun the shards into a new output directory."
    )


def shard_h5ad(entry: Mapping[str, Any], paths: ShardPaths) -> Path:
    """The shard's h5ad, as its entry names it, checked: the entry must name the file the layout
    gives the shard (never a path outside the shards directory, absolute or through ``..``), and
    that file must be a regular file."""
    name, expected = entry.get("h5ad"), paths.h5ad.name
    if name != expected:
        escapes = isinstance(name, str) and (Path(name).is_absolute() or ".." in Path(name).parts)
        problem = f"a path outside {paths.out_dir}" if escapes else "not this shard's file"
        raise ShardOutputError(
            f"shard entry {paths.entry}: h5ad is {_short(name)} ({problem}), expected "
            f"{expected!r}; delete {paths.entry} and rerun shard {paths.shard.index}."
        )
    return regular_file(paths.h5ad, "shard h5ad")


def claim_request_file(out_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``out_dir/request.json`` unless it exists; either way, check it is this request.

    The first of several concurrent array tasks wins (an exclusive hard link); the others find
    its file and compare identity hashes. Returns the record on disk.
    """
    path = out_dir / REQUEST_FILE
    out_dir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        with temporary_beside(path) as tmp:
            tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another task was first: compare below
            except OSError:
                # a filesystem without hard links: exclusive create (not atomic for readers)
                with contextlib.suppress(FileExistsError), path.open("x") as f:
                    f.write(tmp.read_text())
    on_disk = read_json(path, "request file")
    if on_disk.get("identity_sha256") != record["identity_sha256"]:
        changes = describe_changes(on_disk.get("identity", {}), record["identity"])
        raise ShardOutputError(
            f"{out_dir} holds results of a different request ({changes}). Use a new output "
            "directory (--out-dir; st3 scripts: --output_dir), or delete "
            f"{out_dir} to start over; mixing the two would give cells of two requests."
        )
    return on_disk


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``"steps: 50 -> 20, seed: 0 -> 1"`` for the keys (nested one level) that differ."""

    def flat(d: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in d.items():
            if isinstance(value, Mapping):
                out.update(value)
            else:
                out[key] = value
        return out

    a, b = flat(old), flat(new)
    diffs = [
        f"{key}: {_short(a.get(key))} -> {_short(b.get(key))}"
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]
    return ", ".join(diffs) if diffs else "identity hash differs"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def shard_entry(
    *,
    shard: Shard,
    cells: range,
    identity_sha256: str,
    seed: int,
    h5ad: Path,
    h5ad_sha256: str,
    stats: Mapping[str, Any],
    precision_record: Mapping[str, Any],
    resumed_cells: int,
) -> dict[str, Any]:
    """The manifest entry of one finished shard (also its metrics record)."""
    return {
        "format": FORMAT,
        "shard_index": shard.index,
        "num_shards": shard.count,
        "cells": len(cells),
        "cell_range": [cells.start, cells.stop],
        "seed": seed,
        "identity_sha256": identity_sha256,
        "h5ad": h5ad.name,
        "h5ad_sha256": h5ad_sha256,
        "resumed_cells": resumed_cells,
        "timings": dict(stats),
        "precision": dict(precision_record),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
