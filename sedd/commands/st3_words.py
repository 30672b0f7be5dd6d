"""How the st3-compatible scripts read and speak: DCM's ``KEY=VALUE`` words taken as flags, and
every error printed in one line with the script's own flags and job-script variables (never
sedd's), exit status 2."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sedd.commands.st3_flags import Script

# Job-script variables whose flag is not "--" + their lower-case name (the rest map that way:
# EXPERIMENT_DIR=... is --experiment_dir ..., NUM_STEPS=100 is --num_steps 100).
JOB_VARIABLES = {
    "GENES_FILE": "--genes",
    "PERTURBATION_MAP": "--perturbations_all_file",  # sedd's older name for it
}
_WORD = re.compile(r"([A-Z][A-Z0-9_]*)=(.*)", re.DOTALL)


def words_as_flags(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], bool]:
    """(``argv`` with st3's and DCM's ``KEY=VALUE`` words as flags, whether any were).

    DCM's README runs ``inference_conditional.py EXPERIMENT_DIR=... CELL_TYPE=...
    NUM_SAMPLES_PER_PERT=1000 NUM_STEPS=100``: each upper-case word names a flag or a job-script
    variable. A switch takes true/false (or 1/0); a word naming nothing is refused, naming it."""
    options = {o: a for a in parser._actions for o in a.option_strings}
    words, changed, value_next = [], False, False
    for word in argv:
        match = None if value_next else _WORD.fullmatch(word)  # a flag's value stays a value
        taker = options.get(word.split("=", 1)[0]) if word.startswith("-") else None
        value_next = taker is not None and "=" not in word and taker.nargs in (None, 1)
        if match is None:
            words.append(word)
            continue
        key, value = match.groups()
        flag = JOB_VARIABLES.get(key, "--" + key.lower())
        action = options.get(flag)
        if action is None:
            known = sorted(o[2:].upper() for o in options if o[:2] == "--" and "-" not in o[2:])
            raise ValueError(
                f"{key}={value}: {parser.prog} has no flag {flag} and no job-script variable "
                f"{key}; use one of {', '.join(known[:40])}."
            )
        changed = True
        if action.nargs == 0:  # a switch: st3's EVALUATE=true
            if value.lower() in ("true", "1", "yes"):
                words.append(flag)
            elif value.lower() not in ("false", "0", "no", ""):
                raise ValueError(f"{key}={value}: use true or false.")
        elif action.nargs in ("+", "*"):
            words += [flag, *value.split()]
        else:
            words += [flag, value]
    return words, changed


# sedd's own names in library messages -> what the st3 scripts call them (the scripts print
# every error with their own flags and job-script variables).
_ALL_FILE = "(job scripts: PERTURBATIONS_ALL_FILE)"
_SCRIPT_WORDS = (
    ("--perturbation-map FILE", f"--perturbations_all_file FILE {_ALL_FILE}"),
    ("--perturbation-map", f"--perturbations_all_file {_ALL_FILE}"),
    ("--vectors", "--cond_labels_pt_path (job scripts: COND_LABELS_PT_PATH)"),
    ("--genes FILE", "--genes FILE (job scripts: GENES_FILE)"),
    ("--real-condition-key", "--gene"),
    ("--cell-type", "--cell_type"),
    ("--batch-size", "--batch_size"),
    ("--steps", "--num_steps"),
    ("`steps`", "--num_steps"),
    ("sedd.load(..., genes=FILE)", "GENES_FILE=FILE"),
    ("read a counts layer with layer=...", "write raw counts to .X (st3's scripts read .X)"),
    ("pass layer=...", "write raw counts to .X (st3's scripts read .X)"),
)


def in_script_words(message: str, script: Script) -> str:
    """``message`` with sedd's flag names replaced by the st3 script's own."""
    cells = "--num_generate" if script == "generation" else "--num_samples_per_pert"
    for ours, theirs in (*_SCRIPT_WORDS, ("`cells_per_condition`", cells),
                         ("cells_per_condition", cells)):  # fmt: skip
        if theirs not in message:
            message = message.replace(ours, theirs)
    return message


_SCRIPTS: dict[str, Script] = {
    "inference_generation": "generation",
    "inference_conditional": "conditional",
    "inference_perturbseq": "perturbseq",
}


def script_main(entry: Callable[[Sequence[str] | None], int]) -> None:
    """Run a script entry point; user errors print one line and exit 2 (like ``sedd``), naming
    the script's own flags and job-script variables, not sedd's. As in ``sedd``, its outputs
    are its own while it runs (``sedd.io.output_lock``) and a run that fails removes the
    directories it made and left empty."""
    from sedd.commands.interrupts import (
        EXIT_TERMINATED,
        Terminated,
        terminate_cleanly,
        terminated_line,
    )
    from sedd.io.files import NewDirectories
    from sedd.io.output_lock import OutputLocks

    terminate_cleanly()
    with NewDirectories() as made:
        try:
            with OutputLocks():
                code = entry(None)
        except Terminated:
            print(terminated_line(Path(sys.argv[0]).name), file=sys.stderr)
            code = EXIT_TERMINATED
        except (ValueError, FileNotFoundError, FileExistsError) as exc:
            message = in_script_words(str(exc), _SCRIPTS.get(entry.__name__, "conditional"))
            print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
            code = 2
        if code != 0:
            made.remove_empty()
    raise SystemExit(code)
