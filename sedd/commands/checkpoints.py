"""``sedd convert`` and ``sedd info``: any supported checkpoint in the native format, and its
model card."""

from __future__ import annotations

import argparse
import json

from sedd.commands.args import add_source_options


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
    from sedd.checkpoints import save_native
    from sedd.commands.loading import load_source

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
    from sedd.checkpoints import model_card, model_card_dict
    from sedd.commands.loading import load_source

    loaded = load_source(args, args.ckpt)
    if args.json:
        print(json.dumps(model_card_dict(loaded), indent=2))
    else:
        print(model_card(loaded))
    return 0
