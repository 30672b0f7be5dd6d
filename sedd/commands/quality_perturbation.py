"""``sedd quality --model M`` on a perturbation model: the perturbation report instead.

A perturbation model (``Model.control`` set) is judged per perturbation against held-out cells
of its perturbations, beside a cell-mean baseline and a split-half ceiling: what ``sedd evaluate
--perturbation --model`` reports. ``sedd quality`` maps its own flags onto that command's
(``--real``, ``--condition-key``, ``--split-key`` / ``--test-value``, ``--steps``, ``--seed``,
``--precision``, ``--device``, ``--out`` and how the model loads), prints the command it runs,
and runs it through the same parser and code. The bundled PBMC cells hold no perturbations, so
without ``--real`` it stops with the command to run instead.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sedd.defaults import BUNDLED_DATA

if TYPE_CHECKING:
    import anndata

    from sedd.api import Model

# sedd quality's flags the perturbation report has no use for: (dest, flag)
NOT_APPLICABLE = (
    ("seeds", "--seeds"),
    ("max_cells", "--max-cells"),
    ("markers", "--markers"),
    ("resolution", "--resolution"),
    ("batch_size", "--batch-size"),
    ("train_value", "--train-value"),
    ("time_grid", "--time-grid"),
    ("sampler", "--sampler"),
    ("entropy_bound", "--entropy-bound"),
    ("temperature", "--temperature"),
)
# how the model loads: (dest, flag), passed on as given
SOURCE_FLAGS = (
    ("checkpoint", "--checkpoint"),
    ("genes", "--genes"),
    ("perturbation_map", "--perturbation-map"),
    ("vectors", "--vectors"),
)


def evaluate_argv(
    args: argparse.Namespace, control: str, label_key: str | None, real: anndata.AnnData
) -> list[str]:
    """The ``sedd evaluate --perturbation`` arguments that score ``args.model`` as ``sedd
    quality`` was asked to; the label column is ``--condition-key``, else the model's
    ``label_key`` when the file has it, else the one ``sedd evaluate`` finds. Raises ValueError
    when ``--real`` is the bundled PBMC file (it has no perturbations), naming the command to
    run with the user's own held-out cells."""
    model = str(args.model)
    if args.real.resolve() == BUNDLED_DATA.resolve():
        words = ["sedd", "evaluate", "--perturbation", "--model", model]
        words += ["--real", "HELD_OUT.h5ad", "--control-label", control, "--out-dir", str(args.out)]
        command = shlex.join(words)
        raise ValueError(
            f"{model} is a perturbation model (control {control!r}): its report needs held-out "
            f"cells of its perturbations, not the bundled PBMC cells; run {command} (or pass "
            "--real HELD_OUT.h5ad here)."
        )
    argv = ["evaluate", "--perturbation", "--model", model, "--real", str(args.real)]
    argv += ["--control-label", control]
    key = args.condition_key or (label_key if label_key in real.obs.columns else None)
    if key is not None:
        argv += ["--real-condition-key", key]
    if args.split_key in real.obs.columns:
        argv += ["--split-key", args.split_key, "--split-value", args.test_value]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    for dest, flag in SOURCE_FLAGS:
        if getattr(args, dest) is not None:
            argv += [flag, str(getattr(args, dest))]
    if args.raw_weights:
        argv.append("--raw-weights")
    if args.device is not None:
        argv += ["--device", args.device]
    argv += ["--seed", str(args.seed), "--precision", args.precision]
    return [*argv, "--out-dir", str(args.out)]


def ignored_flags(args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
    """The flags of ``NOT_APPLICABLE`` given a value other than their default."""
    return [flag for dest, flag in NOT_APPLICABLE if getattr(args, dest) != getattr(defaults, dest)]


def run_perturbation_report(
    args: argparse.Namespace,
    defaults: argparse.Namespace,
    model: Model,
    real: anndata.AnnData,
    say: Callable[[str], None] = print,
) -> int:
    """Print the ``sedd evaluate`` command that judges perturbation ``model`` and run it."""
    from sedd.commands import evaluate

    control = model.control
    if control is None:
        raise ValueError(f"{model} is not a perturbation model: it has no control label.")
    argv = evaluate_argv(args, control, model.loaded.config.label_key, real)
    parser = argparse.ArgumentParser(prog="sedd")
    evaluate.register(parser.add_subparsers())
    parsed = parser.parse_args(argv)
    say(
        f"{args.model} is a perturbation model (control {control!r}): its perturbation report, "
        f"as `sedd {shlex.join(argv)}` writes it to {Path(args.out)}"
    )
    if ignored := ignored_flags(args, defaults):
        say(f"not used by the perturbation report: {', '.join(ignored)}")
    return parsed.func(parsed)
