"""A model repository: a directory whose entries are checkpoints, each under a stable id.

``model_repository(DIR)`` lists the entries of ``DIR`` that ``load_checkpoint`` can read (any
layout ``detect_layout`` recognises: native, st3, reference SEDD), without loading any: the id of
a directory entry is its name, of a file its name without the suffix. Entries it cannot read are
returned apart, each with the reason, so a server can say why a folder was not served. Hidden
entries (``.name``) are skipped. Ids are what clients send as ``"model"``, so they must be unique
and non-empty; two entries that would share an id are an error naming both.
"""

from __future__ import annotations

import re
from pathlib import Path

from sedd.checkpoints.io import CheckpointError
from sedd.checkpoints.load import detect_layout

__all__ = ["Repository", "model_id_of", "model_repository", "named_models"]

# What an id may hold: it travels in JSON bodies, URLs (/v1/models/{id}) and metric labels.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Repository:
    """Model ids -> checkpoint paths (sorted by id), and the entries skipped with why."""

    def __init__(self, models: dict[str, Path], skipped: dict[str, str]) -> None:
        self.models = dict(sorted(models.items()))
        self.skipped = skipped

    def __contains__(self, model_id: object) -> bool:
        return model_id in self.models

    def __len__(self) -> int:
        return len(self.models)

    def path(self, model_id: str) -> Path:
        return self.models[model_id]


def named_models(paths: dict[str, Path], known: Repository | None = None) -> Repository:
    """Checkpoints named one by one (``sedd serve --model ID=PATH ...``), beside ``known`` (a
    repository's); ``ValueError`` naming the id when an id is malformed or taken, or its path is
    no checkpoint the loader reads."""
    models = dict(known.models) if known is not None else {}
    for model_id, path in paths.items():
        if not _ID.match(model_id):
            raise ValueError(
                f"model id {model_id!r} must be 1-128 letters, digits, '.', '_' or '-' starting "
                "with a letter or digit; pass --model ID=PATH with such an id."
            )
        if model_id in models:
            raise ValueError(
                f"model id {model_id!r} is given twice ({models[model_id]} and {path}); give "
                "each model its own id."
            )
        try:
            detect_layout(path)
        except CheckpointError as err:
            raise ValueError(f"--model {model_id}={path}: {err}") from None
        models[model_id] = Path(path).expanduser().absolute()
    return Repository(models, dict(known.skipped) if known is not None else {})


def model_id_of(path: Path) -> str:
    """The id of a checkpoint entry: a directory's name, a file's stem."""
    return path.name if path.is_dir() else path.stem


def model_repository(directory: str | Path) -> Repository:
    """The checkpoints in ``directory`` (see the module docstring); ``ValueError`` when it is not
    a directory, holds none, or two entries share an id."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ValueError(f"the model repository {root} is not a directory; pass a folder of "
                         "checkpoints (one folder or file per model).")  # fmt: skip
    models: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        model_id = model_id_of(entry)
        if not _ID.match(model_id):
            skipped[entry.name] = (
                "its id is not 1-128 letters, digits, '.', '_' or '-' starting with a letter or "
                "digit; rename it"
            )
            continue
        try:
            detect_layout(entry)
        except CheckpointError as err:
            skipped[entry.name] = str(err)
            continue
        if model_id in models:
            raise ValueError(
                f"two entries of {root} would both be model {model_id!r} "
                f"({models[model_id].name} and {entry.name}); rename one."
            )
        models[model_id] = entry.absolute()
    if not models:
        reasons = "; ".join(f"{name}: {why}" for name, why in list(skipped.items())[:3])
        raise ValueError(
            f"the model repository {root} holds no checkpoint the loader reads"
            + (f" ({reasons})" if reasons else " (it is empty)")
            + "; put one folder per model in it (e.g. what sedd convert writes)."
        )
    return Repository(models, skipped)
