"""st3's ``--config`` YAML, read as st3 reads it: sections ``data``, ``inference`` and ``other``;
a key's value becomes its flag's default (command line > YAML > the script's default); keys no
flag reads are listed once. ``python -m sedd.commands.st3_config CONFIG SECTION.KEY`` prints one
value (the job scripts need ``inference.output_path`` before they run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sedd.commands.st3_flags import Script, flags_for


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
    """The st3 YAML at ``path``; ``ConfigError`` when it is missing, not YAML (or too large, or
    expanding too far: ``sedd.io.yaml_files``) or not sections."""
    from sedd.io.yaml_files import YamlFileError, read_yaml  # only st3 configs need PyYAML

    if not Path(path).is_file():
        raise ConfigError(f"--config {path}: file not found (st3 refuses it too); fix the path.")
    try:
        data = read_yaml(path, what="--config") or {}  # bounded: no alias bomb expands
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected sections data/inference/other, got "
                          f"{type(data).__name__}.")  # fmt: skip
    return data


def _one_value(action: argparse.Action) -> argparse.Action:
    """The same flag taking one value: how each item of a YAML list is typed."""
    return argparse.Action(action.option_strings, action.dest, type=action.type)


def _typed(value: Any, action: argparse.Action, where: str) -> Any:
    """``value`` as the flag's type; ``ConfigError`` naming ``where`` when it is not one."""
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}.")
    kind = action.type or str
    if action.nargs in ("+", "*"):  # a YAML list (st3's inference.perturbations: [A, B])
        items = value if isinstance(value, list) else str(value).split()
        return [_typed(item, _one_value(action), where) for item in items]
    if (kind is int and isinstance(value, bool)) or isinstance(value, (dict, list)):
        raise ConfigError(f"{where} must be a {kind.__name__}, got {value!r}.")
    try:
        typed = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a {kind.__name__}, got {value!r}.") from None
    if kind is int and typed != value and not isinstance(value, str):  # 2.5 is not an int
        raise ConfigError(f"{where} must be a whole number, got {value!r}.")
    return typed


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
