"""Held-out conditions as the field writes them: scLDM's split JSON or a split column.

scLDM's format is ``{"cell_type": [...], "pert": [...]}``: the held-out cell types and
perturbations. A real cell is held out when its perturbation is listed (or it is a control
cell, which every perturbation is compared against) and, if ``cell_type`` is listed and not
empty, its cell type is listed too. An empty or missing list does not restrict that axis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["held_out_mask", "read_split_json"]


def read_split_json(path: Path) -> dict[str, list[str]]:
    """``{"cell_type": [...], "pert": [...]}`` from ``path``, checked."""
    try:
        split = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"--split-json {path} is not JSON ({exc}); write it as "
            '{"cell_type": [...], "pert": [...]}.'
        ) from exc
    if not isinstance(split, Mapping) or not set(split) & {"cell_type", "pert"}:
        raise ValueError(
            f"--split-json {path} must be an object with a 'pert' and/or 'cell_type' list, got "
            f"{json.dumps(split)[:80]}."
        )
    out = {}
    for key in ("cell_type", "pert"):
        values = split.get(key) or []
        if not isinstance(values, list):
            raise ValueError(f"--split-json {path}: {key!r} must be a list, got {values!r}.")
        out[key] = [str(v) for v in values]
    if not out["cell_type"] and not out["pert"]:
        raise ValueError(f"--split-json {path} lists no held-out perturbation or cell type.")
    return out


def held_out_mask(
    obs: pd.DataFrame,
    split: Mapping[str, Any],
    *,
    pert_key: str,
    control_label: str,
    cell_type_key: str | None = None,
) -> np.ndarray:
    """(cells,) bool: the cells ``split`` holds out (see the module docstring)."""
    perts = obs[pert_key].astype(str).to_numpy()
    keep = np.ones(len(obs), dtype=bool)
    if split.get("pert"):
        keep &= np.isin(perts, list(split["pert"])) | (perts == control_label)
    if split.get("cell_type"):
        if cell_type_key is None or cell_type_key not in obs.columns:
            raise ValueError(
                f"the split holds out cell types {list(split['cell_type'])[:5]}, so "
                f"--cell-type-key must name an obs column of the real file, got {cell_type_key!r}"
                f"; available: {list(obs.columns)}."
            )
        keep &= np.isin(obs[cell_type_key].astype(str).to_numpy(), list(split["cell_type"]))
    if not keep.any():
        raise ValueError(f"the split {dict(split)} holds out no real cell; check its names.")
    return keep
