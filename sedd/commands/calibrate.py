"""``sedd calibrate``: search a model's default schedule on held-out cells, store it with the model.

The search is ``sedd.eval.calibration``'s: the reference (50 uniform Euler steps) and each
candidate over ``--seeds`` seeds of the held-out cells' label mix, every set scored with the
project's quality figures; the fewest forwards a cell within seed noise of the reference on
every figure becomes ``calibration.json`` in the model's directory (``--out``: elsewhere), which
every front door then uses when a request names no schedule.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from sedd.commands.args import add_model_arguments, add_precision_argument
from sedd.defaults import BUNDLED_DATA


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="search the model's default schedule on held-out cells (calibration.json)",
        description="Generate --seeds sets of the held-out cells' label mix under 50 uniform "
        "Euler steps and under each --candidate, score each set (correlation RMS, MMD^2, energy "
        "distance, within-label agreement) and store the candidate with the fewest forwards a "
        "cell whose every figure is within seed noise of 50 steps as calibration.json beside the "
        "model's weights: requests that name no schedule then use it. Sets are cached in --work "
        "(the run resumes).",
    )
    add_model_arguments(p)
    p.add_argument(
        "--data",
        type=Path,
        default=BUNDLED_DATA,
        metavar="FILE",
        help="labelled counts (.h5ad) with a 'split' column (train/test): the held-out cells "
        "and the training cells the figures' PCA is fitted on (default: the bundled PBMC data)",
    )
    p.add_argument(
        "--condition-key",
        default="bulk_labels",
        metavar="COLUMN",
        help="obs column of the labels the model is conditioned on",
    )
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="sets per schedule (>= 2)")
    p.add_argument(
        "--candidate",
        action="append",
        metavar="SPEC",
        help="a schedule to try, repeatable: euler:STEPS, analytic:STEPS or entropy:CAP:BOUND "
        "(default: entropy at 8:0, 16:80, 16:110, 16:60, 16:65, 16:70 and euler at 8, 10, 20 "
        "and 30 steps)",
    )
    add_precision_argument(p, "autocast dtype of the model forward")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if any)")
    p.add_argument(
        "--work",
        type=Path,
        default=Path("out/calibrate"),
        metavar="DIR",
        help="where the generated sets are cached (default out/calibrate)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write the calibration (default: the model's calibration.json)",
    )
    p.set_defaults(func=run)


def _shown(path: Path) -> str:
    """``path`` as a record shows it: relative to the working directory when inside it (the
    record of a model in a checkout then holds no machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this calibration again (the run's own options)."""
    words = ["sedd", "calibrate", "--data", _shown(args.data), "--seeds", str(args.seeds)]
    if args.model is not None:
        words += ["--model", _shown(args.model)]
    for candidate in args.candidate or []:
        words += ["--candidate", candidate]
    words += ["--precision", args.precision, "--work", str(args.work)]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    from sedd.api import Model
    from sedd.checkpoints.calibration import Calibration, calibration_path
    from sedd.commands.loading import load_from_args
    from sedd.eval.calibration import DEFAULT_CANDIDATES, Candidate, calibrate
    from sedd.eval.quality import HeldOut
    from sedd.io.files import write_json_atomic
    from sedd.precision import resolve_precision

    if args.seeds < 2:
        raise ValueError(f"--seeds must be >= 2 (seed noise needs two sets), got {args.seeds}.")
    candidates = (
        [Candidate.parse(c) for c in args.candidate] if args.candidate else list(DEFAULT_CANDIDATES)
    )
    loaded = load_from_args(args)
    model = Model(loaded, resolve_precision(args.precision, loaded.device))
    held_out = HeldOut.from_file(args.data, model.genes, args.condition_key)
    print(
        f"calibrating {loaded.path} on {len(held_out.test_labels)} held-out cells of "
        f"{args.data}, {args.seeds} seeds a schedule (sets cached in {args.work})"
    )
    found = calibrate(
        model,
        held_out,
        candidates,
        seeds=args.seeds,
        cache=args.work,
        say=lambda line: print(line, flush=True),
    )
    calibration = Calibration.model_validate(
        {
            **found,
            "weights_sha256": loaded.file_hash,
            "data": _shown(args.data),
            "command": _command(args),
        }
    )
    out = args.out or calibration_path(Path(loaded.path))
    write_json_atomic(out, calibration.model_dump(mode="json"))
    chosen = found["chosen"]
    verdict = (
        "within seed noise of 50 uniform steps"
        if chosen["within_noise_of_reference"]
        else "no candidate was within seed noise of 50 uniform steps: the reference"
    )
    print(
        f"default schedule: {chosen['setting']}, {chosen['forwards_per_cell']:.2f} forwards a "
        f"cell ({verdict}); wrote {out}"
    )
    return 0
