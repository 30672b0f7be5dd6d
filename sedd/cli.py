"""The ``sedd`` command line: a thin dispatcher over ``sedd.commands``.

Building the parser imports no torch (each command imports its work when it runs), so
``sedd --help`` and ``sedd COMMAND --help`` answer at once. Expected faults end in one line on
stderr and a stable exit code (``EXIT_CODES``); ``--debug`` or ``SEDD_DEBUG=1`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from sedd.commands.interrupts import EXIT_TERMINATED, Terminated, terminate_cleanly, terminated_line

# Sub-command modules, each with ``register(subparsers)`` that sets ``func`` on its parser.
_COMMAND_MODULES = (
    "generate",
    "predict",
    "impute",
    "merge",
    "bench",
    "checkpoints",
    "evaluate",
    "quality",
    "calibrate",
    "train",
    "serve",
    "precision_report",
)

# Exit codes of expected faults (docs/cli.md, "Errors and exit codes"): argparse exits 2 on usage.
EXIT_INPUT = 2  # a value, file content, checkpoint or config that cannot be used
EXIT_OS = 3  # the operating system refused: missing path, permissions, not a directory, disk full
EXIT_MEMORY = 4  # out of host or accelerator memory
EXIT_INTERRUPTED = 130
EXIT_CODES = {"input": EXIT_INPUT, "os": EXIT_OS, "memory": EXIT_MEMORY}


def _package_version() -> str:
    try:
        return version("sedd")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's own parser (by name)."""
    parser = argparse.ArgumentParser(
        prog="sedd", description="Score-entropy discrete diffusion for single cells."
    )
    parser.add_argument("--version", action="version", version=f"sedd {_package_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or SEDD_DEBUG=1)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"sedd.commands.{name}").register(subparsers)
    for command in subparsers.choices.values():
        command.formatter_class = DefaultsFormatter
    return parser, dict(subparsers.choices)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option with its default, unless the help already says it or there
    is none to say (no default, or a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text, default = action.help, action.default
        if not text or "default" in text or not action.option_strings:
            return text
        if default is None or default is False or default is argparse.SUPPRESS:
            return text
        if isinstance(default, (list, tuple)):
            default = " ".join(str(v) for v in default)
        return f"{text} (default: {str(default).replace('%', '%%')})"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def _normalise_underscores(argv: list[str], known: set[str]) -> list[str]:
    """st3 spells flags with underscores (``--num_steps``): accept ``--a_b`` for every ``--a-b``."""
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        dashed = flag.replace("_", "-")
        if flag.startswith("--") and flag not in known and dashed in known:
            token = dashed + eq + value
        out.append(token)
    return out


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser, commands = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if a in commands), None)
    if command is not None:
        argv = _normalise_underscores(argv, set(_options(commands[command])))
    args, extras = parser.parse_known_args(argv)
    if extras:  # the command's own usage, with the closest flag it has
        sub = commands[args.command]
        hints = []
        for extra in extras:
            close = difflib.get_close_matches(extra.partition("=")[0], _options(sub), n=1)
            if extra.startswith("-") and close:
                hints.append(f"{extra}: did you mean {close[0]}?")
        sub.error(f"unrecognized arguments: {' '.join(extras)}" + "".join(f"; {h}" for h in hints))
    return args


def _fault(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for an expected fault; None for anything else (a bug)."""
    import torch  # only after a command ran, so `--help` stays light

    from sedd.precision import NonFiniteScoreError

    match exc:
        case NonFiniteScoreError():  # the checkpoint's fault, not ours: a bad input
            return EXIT_INPUT, (
                f"{exc} No cells were written; the checkpoint's weights overflow for this "
                "input (try another checkpoint, or --precision fp32 if it ran in bf16/fp16)."
            )
        case torch.OutOfMemoryError() if "--tokens-per-forward" in str(exc):
            return EXIT_MEMORY, str(exc)
        case torch.OutOfMemoryError() | MemoryError():
            return EXIT_MEMORY, (
                f"out of memory ({exc}); lower --tokens-per-forward (rows per forward) or "
                "--batch-size (cells per job)"
            )
        case OSError() if exc.errno is None:  # ours (a missing model, ...): says what to do
            return EXIT_INPUT, str(exc)
        case OSError() if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f"{exc.filename}: " if exc.filename else ""
            return EXIT_OS, (
                f"{where}{exc.strerror or exc}; nothing was written there. Free some space, or "
                "write to another disk"
            )
        case OSError() if exc.errno == errno.EFBIG:
            where = f"{exc.filename}: " if exc.filename else ""
            return EXIT_OS, (
                f"{where}{exc.strerror or exc}; nothing was written there. The file outgrew "
                "the file-size limit (`ulimit -f`) or the filesystem's largest file: raise the "
                "limit, or write to another disk"
            )
        case OSError() if exc.filename is not None:
            what = exc.strerror or str(exc)
            return EXIT_OS, f"{exc.filename}: {what}; check the path and its permissions"
        case OSError():
            return EXIT_OS, f"{exc}; check the path, its permissions and free disk space"
        case ValueError() | LookupError():
            return EXIT_INPUT, str(exc)
        case RecursionError():
            return EXIT_INPUT, "the input is nested too deeply to read; check the files given"
        case _:
            return None


def _print_warning(message: Warning | str, *_: object, **__: object) -> None:
    """The library's warnings are advice to the user: one plain line each, as they happen
    (written above a progress bar, if one is drawing)."""
    from tqdm import tqdm

    tqdm.write(f"warning: {message}", file=sys.stderr)


def _ignore_file_size_signal() -> None:
    """Past a file-size limit (``ulimit -f``) a write then fails with EFBIG, which the writer
    reports, instead of SIGXFSZ ending the process (Python ignores it already, unless an
    embedding program changed that). Signals are set from the main thread only."""
    if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _run(args: argparse.Namespace) -> int:
    """Run the command; one that fails removes the directories it made and left empty. The
    outputs it claims are its own until it ends (``sedd.io.output_lock``)."""
    from sedd.io.files import NewDirectories
    from sedd.io.output_lock import OutputLocks

    with warnings.catch_warnings(), NewDirectories() as new_directories:
        warnings.simplefilter("default", UserWarning)  # each distinct warning once a run
        warnings.showwarning = _print_warning
        with OutputLocks():  # released first: a directory made for an output is then empty
            code = int(args.func(args) or 0)
        if code != 0:
            new_directories.remove_empty()
        return code


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    debug = args.debug or os.environ.get("SEDD_DEBUG", "") not in ("", "0")
    _ignore_file_size_signal()
    if args.command != "serve":  # `sedd serve` drains on SIGTERM (server.serve)
        terminate_cleanly()
    try:
        return _run(args)
    except Terminated:
        print(terminated_line(f"sedd {args.command}"), file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"sedd {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        code, line = _fault(exc) or (
            1,
            f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
        )
        print(f"sedd {args.command}: error: {' '.join(line.split())}", file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
