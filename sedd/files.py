"""Files written so that a reader never sees half of one: atomic JSON, and content hashes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to a temporary name beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
    """A unique hidden name in ``path``'s directory (``os.replace`` must not cross filesystems)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def temporary_beside(path: Path) -> Iterator[Path]:
    tmp = temporary_name(path)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
