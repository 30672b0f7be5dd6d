"""Every flag st3's inference scripts define, and its ``--config`` YAML, in one table.

``ST3_FLAGS`` lists each flag of st3's ``scripts/inference_conditional.py`` and
``scripts/inference_generation.py`` (both of its versions: the ``--data_path`` comparison one and
the ``--reference_data``/``--output_path`` one) with what it means here. A flag is one of:

- ``honoured``: it does what it does in st3 (the help says how);
- ``noted``: st3 parses it and uses it only for its plots or prints, or not at all; accepted, and
  one line says it changes nothing here.

``read_st3_config`` reads a ``--config`` YAML as st3 does: sections ``data``, ``inference`` and
``other``; a key's value becomes that flag's default, so the command line still wins (st3's
precedence: command line > YAML > the script's default). A missing file is an error (st3 raises
too); keys no flag reads (st3 shares one YAML between training and inference) are listed once.

The parsers use ``allow_abbrev=False``: st3's ``--gene`` must never be taken for ``--genes``,
nor ``--perturbations`` for ``--perturbations_file``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sedd.defaults import CELLS_PER_PERTURBATION

Script = Literal["conditional", "generation", "perturbseq"]
COND: frozenset[Script] = frozenset({"conditional", "perturbseq"})
GEN: frozenset[Script] = frozenset({"generation"})
ALL: frozenset[Script] = COND | GEN
ST3_SEED = 42  # st3's scripts: `--seed` default 42 (and the YAML's other.seed)


@dataclass(frozen=True)
class St3Flag:
    """One st3 flag: where st3 defines it, the YAML key that sets it, and what it does here."""

    flag: str
    scripts: frozenset[Script]
    kwargs: Mapping[str, Any]
    yaml: tuple[tuple[str, str], ...] = ()  # (section, key), first found wins
    noted: str | None = None  # why accepting it changes nothing here
    dest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dest", self.flag.lstrip("-"))


def _path(help_: str) -> dict[str, Any]:
    return {"default": None, "metavar": "PATH", "help": help_}


ST3_FLAGS: tuple[St3Flag, ...] = (
    St3Flag("--config", ALL, _path("st3 YAML: sections data, inference, other set defaults")),
    St3Flag("--experiment_dir", ALL, {"required": True, "help": "st3 experiment or sedd model"}),
    St3Flag(
        "--checkpoint",
        ALL,
        _path(
            "checkpoint file, as given (relative to the working directory, as in st3), else a "
            "name inside --experiment_dir; default best.pt > final.pt > newest epoch_N.pt"
        ),
    ),
    St3Flag(
        "--perturbations_file",
        COND,
        _path("perturbations to generate, one a line (default: every label of the model)"),
        (("inference", "perturbations_file"),),
    ),
    St3Flag(
        "--perturbations_all_file",
        COND,
        _path("every perturbation in training order: control is index 0, the others follow"),
        (("inference", "perturbations_all_file"),),
    ),
    St3Flag(
        "--perturbations",
        COND,
        {
            "nargs": "+",
            "default": None,
            "metavar": "NAME",
            "help": "perturbations to generate, named on the command line",
        },
    ),
    St3Flag(
        "--test_data_path",
        COND,
        _path("h5ad of held-out real cells: with --evaluate, `sedd evaluate` compares to it"),
        (("data", "test_data_path"),),
    ),
    St3Flag(
        "--mapping_data_path",
        COND,
        _path(
            "st3: h5ad whose labels gave the index mapping (noted: the mapping comes from "
            "--perturbations_all_file or the model's names file)"
        ),
        (("data", "mapping_data_path"), ("data", "train_data_path")),
        noted="the label order comes from --perturbations_all_file or the model's names file",
    ),
    St3Flag(
        "--cond_labels_pt_path",
        COND,
        _path("perturbation vectors {name: tensor} of a vector-conditioned model"),
        (("data", "cond_labels_pt_path"),),
    ),
    St3Flag(
        "--gene",
        COND,
        {
            "default": "perturbation",
            "metavar": "COLUMN",
            "help": "obs column of the labels in --test_data_path (default perturbation); the "
            "generated cells' column is always perturbation",
        },
        (("data", "gene"),),
    ),
    St3Flag(
        "--control_name",
        COND,
        {"default": None, "help": "the control label (default: the model's own)"},
        (("data", "control_name"),),
    ),
    St3Flag(
        "--num_samples_per_pert",
        COND,
        {
            "type": int,
            "default": CELLS_PER_PERTURBATION,
            "help": f"cells per perturbation (default {CELLS_PER_PERTURBATION}, st3's)",
        },
        (("inference", "num_samples_per_pert"),),
    ),
    St3Flag(
        "--num_generate",
        GEN,
        {"type": int, "default": 100, "help": "cells to generate (default 100, st3's)"},
        (("inference", "num_generate"),),
    ),
    St3Flag(
        "--num_steps",
        COND,
        {"type": int, "default": 50, "help": "reverse diffusion steps (default 50, st3's)"},
        (("inference", "num_steps"),),
    ),
    St3Flag(
        "--num_steps",
        GEN,
        {"type": int, "default": 100, "help": "reverse diffusion steps (default 100, st3's)"},
        (("inference", "num_steps"),),
    ),
    St3Flag(
        "--temperature",
        ALL,
        {"type": float, "default": 1.0, "help": "sampling temperature (default 1.0)"},
        (("inference", "temperature"),),
    ),
    St3Flag(
        "--seed",
        ALL,
        {
            "type": int,
            "default": ST3_SEED,
            "help": f"cell i draws from the random stream (seed, i) (default {ST3_SEED}, st3's)",
        },
        (("other", "seed"),),
    ),
    St3Flag(
        "--evaluate",
        COND,
        {"action": "store_true", "help": "then run `sedd evaluate` against --test_data_path"},
    ),
    St3Flag(
        "--num_cells_visualize",
        ALL,
        {"type": int, "default": None, "help": "st3's plots (noted: sedd draws none)"},
        (("inference", "num_cells_visualize"),),
        noted="sedd draws no plots here; `sedd evaluate` draws them",
    ),
    St3Flag(
        "--reference_data",
        GEN,
        _path("h5ad whose var_names name the genes (st3 copies var from it)"),
        (("inference", "reference_data"),),
    ),
    St3Flag(
        "--output_path",
        GEN,
        _path("the h5ad to write (default <experiment_dir>/inference/generated_cells.h5ad)"),
        (("inference", "output_path"),),
    ),
    St3Flag(
        "--keep_sparse",
        GEN,
        {"action": "store_true", "help": "keep X sparse (sedd always writes sparse CSR counts)"},
        (("inference", "keep_sparse"),),
        noted="sedd always writes X as sparse CSR counts",
    ),
    St3Flag(
        "--data_path",
        GEN,
        _path("st3 (older version): real cells for its comparison plots (noted)"),
        noted="st3 compared against it in plots; use `sedd evaluate --real` for that",
    ),
    St3Flag(
        "--val_fraction",
        GEN,
        {"type": float, "default": None, "help": "st3's comparison split (noted)"},
        noted="it split --data_path for st3's comparison plots",
    ),
    St3Flag(
        "--use_train_split",
        GEN,
        {"action": "store_true", "help": "st3's comparison split (noted)"},
        noted="it chose st3's comparison split",
    ),
    St3Flag(
        "--num_real_visualize",
        GEN,
        {"type": int, "default": None, "help": "st3's plots (noted)"},
        noted="sedd draws no plots here; `sedd evaluate` draws them",
    ),
)


def flags_for(script: Script) -> list[St3Flag]:
    return [f for f in ST3_FLAGS if script in f.scripts]


def add_st3_flags(p: argparse.ArgumentParser, script: Script) -> None:
    for f in flags_for(script):
        p.add_argument(f.flag, dest=f.dest, **f.kwargs)


class ConfigError(ValueError):
    """A ``--config`` file that cannot be read or holds a value of the wrong type."""


def config_path(argv: list[str]) -> str | None:
    """``--config``'s value, read before the full parse (as st3 does: the YAML sets defaults)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    return known.config


def read_st3_config(
    path: str, script: Script, parser: argparse.ArgumentParser
) -> tuple[dict[str, Any], list[str]]:
    """(Defaults for ``parser`` from the YAML at ``path``, keys no flag of ``script`` reads).

    A value of the wrong type is a ``ConfigError`` naming the file, the key and the value; a
    null value counts as unset (the script's default applies)."""
    data = _load_yaml(path)
    actions = {a.dest: a for a in parser._actions}
    defaults: dict[str, Any] = {}
    for f in flags_for(script):
        for section, key in f.yaml:
            body = data.get(section)
            value = body.get(key) if isinstance(body, dict) else None
            if value is not None and f.dest not in defaults:
                defaults[f.dest] = _typed(value, actions[f.dest], f"{path}: {section}.{key}")
    readable = {key for f in flags_for(script) for key in f.yaml}
    unused = []
    for section, body in data.items():
        if isinstance(body, dict) and section in ("data", "inference", "other"):
            unused += [f"{section}.{k}" for k in body if (section, k) not in readable]
        else:
            unused.append(f"{section} (section)")
    return defaults, unused


def _load_yaml(path: str) -> dict[str, Any]:
    """The st3 YAML at ``path``; ``ConfigError`` when it is missing, not YAML or not sections."""
    import yaml  # only st3 configs need it

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config {path}: file not found (st3 refuses it too); fix the path.")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"--config {path}: not valid YAML ({first}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected sections data/inference/other, got "
                          f"{type(data).__name__}.")  # fmt: skip
    return data


def _typed(value: Any, action: argparse.Action, where: str) -> Any:
    """``value`` as the flag's type; ``ConfigError`` naming ``where`` when it is not one."""
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}.")
    kind = action.type or str
    if (kind is int and isinstance(value, bool)) or isinstance(value, (dict, list)):
        raise ConfigError(f"{where} must be a {kind.__name__}, got {value!r}.")
    try:
        typed = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a {kind.__name__}, got {value!r}.") from None
    if kind is int and typed != value and not isinstance(value, str):  # 2.5 is not an int
        raise ConfigError(f"{where} must be a whole number, got {value!r}.")
    return typed


def notes_for(script: Script, given: set[str]) -> list[str]:
    """One line per noted flag that was set (on the command line or by the YAML)."""
    return [
        f"{f.flag}: accepted for st3 compatibility; {f.noted}."
        for f in flags_for(script)
        if f.noted and f.dest in given
    ]


def yaml_value(path: str, section: str, key: str) -> str:
    """``section.key`` of the st3 YAML at ``path`` as text, "" when unset (what a job script
    needs before it runs the script: generation's ``inference.output_path`` names the file the
    shards merge into)."""
    body = _load_yaml(path).get(section)
    value = body.get(key) if isinstance(body, dict) else None
    return "" if value is None else str(value)


if __name__ == "__main__":  # python -m sedd.commands.st3_flags CONFIG SECTION.KEY (job scripts)
    try:
        print(yaml_value(sys.argv[1], *sys.argv[2].split(".", 1)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
