"""``sedd convert`` and ``sedd info``, plus the model options every other command shares.

``add_model_arguments(parser)`` + ``load_from_args(args)`` let any command accept any supported
checkpoint source (native, st3 experiment, reference SEDD model directory or training run).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from sedd.checkpoints import (
    DEFAULT_MODEL,
    CheckpointNotFoundError,
    LoadedModel,
    load_checkpoint,
    model_card,
    model_card_dict,
    save_native,
)

__all__ = [
    "add_model_arguments",
    "add_source_options",
    "load_from_args",
    "load_source",
    "register",
]


def add_source_options(
    parser: argparse.ArgumentParser, mapping_flag: str = "--perturbations"
) -> None:
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
        mapping_flag,
        dest="perturbation_map",
        metavar="FILE",
        help="perturbation names: JSON {name: index}, text (line i = index i) or st3's .pt",
    )
    parser.add_argument(
        "--vectors", metavar="FILE", help="perturbation vectors {name: tensor} (.pt or safetensors)"
    )


def add_model_arguments(
    parser: argparse.ArgumentParser, mapping_flag: str = "--perturbations"
) -> None:
    """``--model PATH`` (any supported source) and the options that refine how it loads.

    ``mapping_flag`` renames the perturbation-mapping file option, for commands (``predict``)
    whose ``--perturbations`` takes names.
    """
    parser.add_argument(
        "--model",
        "--checkpoint-dir",
        "--experiment-dir",
        dest="model",
        metavar="PATH",
        help="native model dir, st3 experiment dir, reference SEDD model dir or training run "
        f"(default: {DEFAULT_MODEL})",
    )
    add_source_options(parser, mapping_flag)


def load_source(args: argparse.Namespace, source: str | Path) -> LoadedModel:
    """Load ``source`` as the ``add_source_options`` options in ``args`` say."""
    # Loader warnings (unnamed genes, ...) are advice to the user: print them plainly.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        loaded = load_checkpoint(
            source,
            checkpoint=args.checkpoint,
            use_ema=not args.raw_weights,
            genes=args.genes,
            perturbations=args.perturbation_map,
            vectors=args.vectors,
            device=getattr(args, "device", None) or "cpu",
        )
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    return loaded


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    """Load the model named by ``add_model_arguments`` options (the bundled default if none)."""
    source = args.model
    if source is None:
        if not DEFAULT_MODEL.exists():
            raise CheckpointNotFoundError(
                f"no model given and the bundled default model at {DEFAULT_MODEL} is missing; "
                "pass --model PATH."
            )
        source = DEFAULT_MODEL
    return load_source(args, source)


def register(subparsers: argparse._SubParsersAction) -> None:
    convert = subparsers.add_parser(
        "convert",
        help="write any supported checkpoint in the native format",
        description="Read SRC (native, st3 experiment dir, reference SEDD model dir or training "
        "run) and write DST/config.json + DST/model.safetensors (fp32).",
    )
    convert.add_argument("src", metavar="SRC", help="the checkpoint to convert")
    convert.add_argument("dst", metavar="DST", help="the native model directory to write")
    add_source_options(convert)
    convert.add_argument("--training-command", metavar="STR", help="recorded in provenance")
    convert.add_argument("--data-hash", metavar="STR", help="recorded in provenance")
    convert.set_defaults(func=run_convert)

    info = subparsers.add_parser(
        "info",
        help="print a model card for any supported checkpoint",
        description="Architecture, parameter count, genes, labels, vocabulary, "
        "parametrisation and the weights file's sha256.",
    )
    info.add_argument("ckpt", metavar="CKPT", help="the checkpoint to describe")
    add_source_options(info)
    info.add_argument("--json", action="store_true", help="print the card as JSON")
    info.set_defaults(func=run_info)


def run_convert(args: argparse.Namespace) -> int:
    loaded = load_source(args, args.src)
    dst = save_native(
        loaded, args.dst, training_command=args.training_command, data_hash=args.data_hash
    )
    print(
        f"wrote {dst} ({loaded.config.architecture}, {loaded.num_parameters:,} parameters, "
        f"{loaded.config.num_genes} genes) from {loaded.layout} source {args.src}"
    )
    return 0


def run_info(args: argparse.Namespace) -> int:
    loaded = load_source(args, args.ckpt)
    if args.json:
        print(json.dumps(model_card_dict(loaded), indent=2))
    else:
        print(model_card(loaded))
    return 0
