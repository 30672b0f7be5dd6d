"""Schema migrations of ``config.json``: ``MIGRATIONS[v]`` turns a version-v dict into a
version-(v + 1) dict; ``migrate`` upgrades any earlier version to ``SCHEMA_VERSION``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SCHEMA_VERSION = 1


def _v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (no ``schema_version``): derived sections may be absent; fill them.

    ``parametrisation``, ``graph``, ``tokens`` follow from the architecture; the noise defaults to
    log-linear (eps 1e-3) for absorbing graphs; genes missing -> named by position.
    """
    data = dict(data)
    architecture, arch = data.get("architecture"), data.get("arch")
    if not isinstance(arch, dict) or architecture not in ("st3", "st3_perturbation", "ddit"):
        return data  # validation reports what is missing
    if architecture == "ddit":
        vocab, graph_type, length = arch.get("vocab_size"), arch.get("graph"), arch.get("length")
    else:
        num_bins = arch.get("num_bins")
        vocab = None if num_bins is None else num_bins + 1
        graph_type, length = "absorb", arch.get("num_genes")
    data.setdefault("parametrisation", "score" if architecture == "ddit" else "x0")
    if vocab is not None and graph_type in ("absorb", "uniform"):
        absorb = graph_type == "absorb"
        data.setdefault("graph", {"type": graph_type, "dim": vocab})
        data.setdefault(
            "tokens",
            {
                "num_bins": vocab - 1 if absorb else vocab,
                "mask_index": vocab - 1 if absorb else None,
                "vocab_size": vocab,
            },
        )
        if absorb:
            data.setdefault("noise", {"type": "loglinear", "eps": 1e-3})
    if "genes" not in data and isinstance(length, int):
        data["genes"] = [str(i) for i in range(length)]
        data["genes_by_position"] = True
    return data


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _v0_to_v1}


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a config dict of any earlier schema version to ``SCHEMA_VERSION``."""
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"schema_version must be a non-negative integer, got {version!r}.")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"config schema_version {version} is newer than this sedd understands "
            f"({SCHEMA_VERSION}); upgrade sedd to load it."
        )
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    return {**data, "schema_version": SCHEMA_VERSION}
