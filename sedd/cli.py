"""The ``sedd`` command line: a thin dispatcher over ``sedd.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Sub-command modules, each with ``register(subparsers)`` that sets ``func`` on its parser.
_COMMAND_MODULES = (
    "generate",
    "predict",
    "impute",
    "merge",
    "bench",
    "checkpoints",
    "evaluate",
    "train",
    "serve",
    "precision_report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sedd", description="Score-entropy discrete diffusion for single cells."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"sedd.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"sedd {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
