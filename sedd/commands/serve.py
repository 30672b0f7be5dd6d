"""``sedd serve``: the HTTP service (``server.app``) under uvicorn.

Settings come from ``SEDD_*`` environment variables (``server.config.Settings``); the flags
given here override them. Every setting but the API key has a flag, generated from the settings'
own fields, so ``sedd serve --help`` lists each with its variable and default. The API key is
read from ``SEDD_API_KEY`` only, never from a flag (command lines are visible to every user of
the machine).
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

ENV_ONLY = ("api_key",)  # secrets: never a flag
FROM_MODEL_FLAG = ("model_map",)  # set by repeated --model ID=PATH (or its JSON variable)
# Other spellings of a setting's flag: the ones `sedd generate` also takes.
ALIASES = {"model": ["--checkpoint-dir"], "perturbation_map": ["--perturbations-all-file"]}
SIDE_FILES = ("genes", "perturbation_map", "vectors")  # files the model loads with


def register(subparsers: argparse._SubParsersAction) -> None:
    from server.config import Settings  # pydantic only: the web stack waits for `run`

    p = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP (generate, predict, impute, metrics)",
        description="Start the inference service. Every setting below is also the environment "
        "variable in its help (SEDD_<NAME>); a flag wins over the environment. The API key is "
        "SEDD_API_KEY only (a bearer key every route but /healthz then needs; unset: no key).",
    )
    for name, field in Settings.model_fields.items():
        if name in ENV_ONLY or name in FROM_MODEL_FLAG:
            continue
        flags = [_flag(name), *ALIASES.get(name, [])]
        kind = _kind(field.annotation)
        if name == "model":  # PATH, or ID=PATH repeated: several models by name
            kind = {"action": "append", "metavar": "PATH|ID=PATH"}
        p.add_argument(*flags, dest=name, help=_help(name, field), **kind)
    p.set_defaults(func=run)


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _help(name: str, field: Any) -> str:
    default = field.default
    if name == "model":
        default = "the bundled models/pbmc_default"
        what = (f"{field.description}; or ID=PATH, repeated, to serve several models by id "
                "(JSON {id: path} in env SEDD_MODEL_MAP, default none); ")  # fmt: skip
        return f"{what}env SEDD_MODEL, default {default}".replace("%", "%%")
    shown = "none" if default is None else default
    what = f"{field.description}; " if field.description else ""
    return f"{what}env SEDD_{name.upper()}, default {shown}".replace("%", "%%")


def _kind(annotation: Any) -> dict[str, Any]:
    """argparse's type, choices or action for a settings field's annotation."""
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction, "default": None}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(kinds) > 1:  # e.g. int | Literal["auto"]: the settings parse the text
            return {"type": str, "metavar": "N|auto"}
        annotation = kinds[0]
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    metavar = {int: "N", float: "X", str: "TEXT"}.get(annotation, "PATH")
    return {"type": annotation, "metavar": metavar}


def _models_named(values: list[str] | None) -> dict[str, Any]:
    """``--model PATH`` (one model, as always; given twice, the last) or ``--model ID=PATH``
    repeated (``model_map``, in the order given: the first is the default unless
    --default-model says otherwise)."""
    from pathlib import Path

    if not values:
        return {}
    named = [v for v in values if "=" in v]
    if not named:  # the last one wins, as for every other flag given twice
        return {"model": Path(values[-1])}
    if len(named) != len(values):
        plain = [v for v in values if "=" not in v]
        raise ValueError(
            f"--model {plain[0]} has no id while other --model flags do; write every one as "
            "--model ID=PATH."
        )
    found: dict[str, Path] = {}
    for value in named:
        model_id, _, path = value.partition("=")
        if model_id in found:
            raise ValueError(f"--model {value}: the id {model_id!r} is given twice.")
        found[model_id] = Path(path)
    return {"model_map": found}


def run(args: argparse.Namespace) -> int:
    # The web stack is imported here, so other commands do not pay for it.
    import logging

    from pydantic import ValidationError

    from server.app import create_app, preload
    from server.config import Settings
    from server.serve import serve

    skip = (*ENV_ONLY, *FROM_MODEL_FLAG, "model")  # --model: one path, or ID=PATH repeated
    names = [name for name in Settings.model_fields if name not in skip]
    overrides = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    overrides.update(_models_named(args.model))
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ValueError(f"invalid settings: {problems}") from None
    if not settings.serves_many and not settings.model.exists():
        raise FileNotFoundError(f"no model at {settings.model}; pass --model PATH.")
    for name in SIDE_FILES:  # here, before a replica or the app tries to read them
        path = getattr(settings, name)
        if path is not None and not path.is_file():
            raise FileNotFoundError(
                f"{_flag(name)} {path} (SEDD_{name.upper()}) is not a file; pass an existing "
                f"file, or leave {_flag(name)} out."
            )
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:  %(message)s")
    if settings.replicas is not None:
        from server.ray import replicas

        replicas.run(settings)
        return 0
    app = create_app(settings)
    preload(app)  # a bad checkpoint is a one-line error here, before anything listens
    serve(app, settings)
    return 0
