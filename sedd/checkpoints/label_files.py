"""Reading label files as training wrote them: ``{name: index}`` maps (DCM's scalar conditional
labels, where -1 marks a name with no row and indices may leave rows unnamed), name lists (JSON,
``.pt`` or one name a line), and telling an index file from a ``{name: vector}`` file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from sedd.checkpoints.io import CheckpointError, read_torch_file, require_file


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    repeated = [key for key, n in Counter(k for k, _ in pairs).items() if n > 1]
    if repeated:
        raise ValueError(f"names listed more than once: {repeated[:10]}")
    return dict(pairs)


def _scalar_index(value: Any) -> int | None:
    """``value`` as a label index when it is one (an int, or a 0-d integer tensor), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        return int(value)
    return None


def label_file_kind(path: str | Path) -> str:
    """What a ``{name: ...}`` label file holds: ``"indices"`` (``{name: int}``, DCM's scalar
    conditional labels), ``"vectors"`` (``{name: tensor}``, e.g. ESM2) or ``"names"`` (anything
    else: a list, or text). Only ``.pt``/``.pth``/``.json``/``.safetensors`` files are opened."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return "vectors"
    if path.suffix not in (".pt", ".pth", ".json"):
        return "names"
    data = read_mapping_file(require_file(path, "label file"))
    if isinstance(data, dict) and data:
        values = list(data.values())
        if all(_scalar_index(v) is not None for v in values):
            return "indices"
        if all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in values):
            return "vectors"
    return "names"


def read_mapping_file(path: Path) -> Any:
    if path.suffix in (".pt", ".pth"):
        return read_torch_file(path)
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text(), object_pairs_hook=reject_duplicate_keys)
        except ValueError as err:  # JSONDecodeError is a ValueError too
            raise CheckpointError(f"{path}: {err}; each label must appear once.") from None
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    names = [line.strip() for line in lines]
    if "" in names:
        raise CheckpointError(
            f"{path} has an empty line {names.index('') + 1}; line i must name label index i."
        )
    return names


def index_map_names(
    mapping: dict[Any, Any], expected: int, file: Path, kind: str
) -> list[str | None]:
    """``{name: index}`` as training used it (DCM's scalar label files): names by index, ``None``
    where no name has that index. Names mapped to -1 (absent when the file was built) are left
    out; two names on one index, or an index outside the model's rows, are refused."""
    by_index: dict[int, str] = {}
    for name, value in mapping.items():
        index = _scalar_index(value)
        if index is None:
            raise CheckpointError(
                f"{file}: {kind} {name!r} maps to {value!r}; a label index file maps every name "
                "to an integer. Pass the file training used."
            )
        if index == -1:
            continue  # DCM writes -1 for a name it did not find: it has no row
        if not 0 <= index < expected:
            raise CheckpointError(
                f"{file}: {kind} {name!r} has index {index}, but the model has {expected} "
                f"{kind} rows (0..{expected - 1}); pass the index file this checkpoint was "
                "trained with."
            )
        if index in by_index:
            raise CheckpointError(
                f"{file}: {kind}s {by_index[index]!r} and {name!r} share index {index}; each "
                "index must name one label."
            )
        by_index[index] = str(name)
    if not by_index:
        raise CheckpointError(f"{file} gives no {kind} a usable index (all are -1).")
    return [by_index.get(i) for i in range(expected)]
