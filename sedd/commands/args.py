"""The options several commands share, defined without importing torch or the library.

``sedd --help`` and ``sedd COMMAND --help`` build every parser, so nothing here (or at the top
of a command module) may import more than argparse and ``sedd.defaults``; the work a command does
is imported when it runs.

Vocabulary (the same in the CLI, the Python API, HTTP and the .h5ad files): a *condition* is a
model's label (a cell type or a perturbation); *perturbation* names only the labels of
perturbation models. The name -> index file of a perturbation model is ``--perturbation-map``
everywhere. st3's underscore spellings (``--num_steps``) are accepted for every flag.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from sedd.defaults import DEFAULT_MODEL, SCHEDULE_FIELDS, SamplingOptions


def add_option_argument(p: argparse.ArgumentParser, option: Field[Any]) -> None:
    """The flag of one ``SamplingOptions`` field: ``--name`` (and its extra spellings), typed
    and with choices as the field is, defaulting to None for the schedule (``steps``,
    ``time_grid``, ``sampler`` and ``entropy_bound`` resolve together, from the model's)
    and to the field's default otherwise. Values are checked by ``SamplingOptions`` itself,
    so the CLI, the API and HTTP refuse the same ones."""
    kind = get_type_hints(SamplingOptions)[option.name]
    choices = get_args(kind) if get_origin(kind) is Literal else None
    schedule = option.name in SCHEDULE_FIELDS
    default = None if schedule else option.default
    shown = "" if schedule else f" (default {option.default})"
    p.add_argument(
        "--" + option.name.replace("_", "-"),
        *option.metadata["flags"],
        dest=option.name,
        type=None if choices else kind,
        choices=list(choices) if choices else None,
        default=default,
        help=option.metadata["help"] + shown,
    )


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """The options that refine how a model source loads, for commands that take the source
    positionally (``sedd info CKPT``); ``add_model_arguments`` adds ``--model`` to these."""
    parser.add_argument(
        "--checkpoint",
        metavar="NAME",
        help="file inside the source to load (st3: epoch_3.pt; default best > final > "
        "highest epoch; reference runs: checkpoints-meta/checkpoint.pth)",
    )
    parser.add_argument(
        "--raw-weights",
        action="store_true",
        help="load a reference SEDD training run's raw weights instead of its EMA weights",
    )
    parser.add_argument(
        "--genes",
        metavar="FILE",
        help="gene names in model order: text (one a line) or an h5ad whose var_names are used",
    )
    parser.add_argument(
        "--perturbation-map",
        "--perturbations-all-file",
        dest="perturbation_map",
        metavar="FILE",
        help="perturbation label names in index order: JSON {name: index}, text (line i = "
        "index i) or st3's .pt",
    )
    parser.add_argument(
        "--vectors", metavar="FILE", help="perturbation vectors {name: tensor} (.pt or safetensors)"
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model PATH`` (any supported source) and the options that refine how it loads."""
    parser.add_argument(
        "--model",
        "--checkpoint-dir",
        "--experiment-dir",
        dest="model",
        metavar="PATH",
        help="native model dir, st3 experiment dir, reference SEDD model dir or training run "
        f"(default: the bundled model, {DEFAULT_MODEL})",
    )
    add_source_options(parser)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Sampling options shared by ``generate``, ``predict`` and ``impute``: one flag per field
    of ``SamplingOptions`` (``--time-grid`` for ``time_grid``), its help and choices from the
    field, then the run's own options (precision, batch size, forward block, device)."""
    for option in fields(SamplingOptions):
        add_option_argument(p, option)
    add_precision_argument(p)
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="cells in flight at once (memory); never changes a cell (default 64)",
    )
    p.add_argument(
        "--tokens-per-forward",
        type=int,
        metavar="N",
        help="rows x genes per model forward (default 1024 on CPU, 131072 on CUDA); every "
        "forward runs on N // genes rows, so cells do not depend on their batch",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if any)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads to sample on, set where sampling starts (default: SEDD_THREADS, "
        "else torch's own); never changes a cell",
    )
    add_cuda_graphs_argument(p)
    p.add_argument("--cell-type", help="condition every cell on this cell type")


def add_precision_argument(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    help: str = "autocast dtype of the model forward (auto: bf16 where it is fast)",
    default: str = "auto",
) -> None:
    """``--precision``: the autocast dtype of the model forward, one choice for every command."""
    p.add_argument("--precision", default=default, choices=["auto", "bf16", "fp16", "fp32"],
                   help=help)  # fmt: skip


def add_cuda_graphs_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay each forward block from a captured CUDA graph (CUDA only; never changes a "
        "cell; default: SEDD_CUDA_GRAPHS, else off)",
    )


def add_shard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-shards",
        "--num_shards",  # the st3 scripts' own parsers spell flags so
        dest="num_shards",
        type=int,
        help="split the request's cells into N contiguous shards (default: "
        "$SLURM_ARRAY_TASK_COUNT, else 1); needs --out-dir when N > 1",
    )
    p.add_argument(
        "--shard-index",
        "--shard_index",
        dest="shard_index",
        type=int,
        help="which shard to run, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN)",
    )


def add_output_arguments(
    p: argparse.ArgumentParser, default_out: Path, *, shards: bool = True
) -> None:
    """``--out FILE`` or ``--out-dir DIR`` (resumable shards), the shard options, counts dtype.
    ``shards=False``: one file only (``--out``, counts dtype)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out", type=Path, default=None, help=f"write one .h5ad file (default {default_out})"
    )
    add_overwrite_argument(p)
    add_counts_dtype_argument(p)
    p.set_defaults(default_out=default_out)
    if not shards:
        p.set_defaults(out_dir=None, num_shards=1, shard_index=0)
        return
    where.add_argument(
        "--out-dir",
        type=Path,
        help="sharded, resumable output: DIR/request.json + DIR/shards/; `sedd merge DIR` joins",
    )
    add_shard_arguments(p)


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out file (default: refuse before any work; nothing is lost)",
    )


def add_counts_dtype_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--counts-dtype",
        choices=["int", "float32"],
        default="int",
        help="float32 stores the integer counts as floats (for Arc's cell-eval); with --out-dir, "
        "pass it to `sedd merge`",
    )


def add_progress_argument(p: argparse.ArgumentParser) -> None:
    """``--progress/--no-progress`` for a command that draws progress bars; read it with
    ``show_progress(args.progress)``."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw progress bars on stderr (default: only when stderr is a terminal, so none "
        "in SLURM .out files or logs)",
    )


def show_progress(asked: bool | None) -> bool:
    """Whether to draw progress bars: as asked, else only when stderr is a terminal (a bar
    redrawn into a file is a line of carriage returns per update)."""
    if asked is not None:
        return asked
    return bool(getattr(sys.stderr, "isatty", lambda: False)())
