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
from typing import Any

from sedd.checkpoint import CheckpointNotFoundError, LoadedModel, load_checkpoint, save_native

__all__ = [
    "DEFAULT_MODEL",
    "add_model_arguments",
    "add_source_options",
    "load_from_args",
    "load_source",
    "model_card",
    "model_card_dict",
    "register",
]

# The model served when no --model is given; relative to the repository root.
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "pbmc_default"


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


def model_card_dict(loaded: LoadedModel) -> dict[str, Any]:
    config = loaded.config
    vectors = loaded.perturbation_vectors
    return {
        "path": str(loaded.path),
        "layout": loaded.layout,
        "weights_file": str(loaded.weights_file) if loaded.weights_file else None,
        "sha256": loaded.file_hash,
        "architecture": config.architecture,
        "arch": config.arch.model_dump(),
        "num_parameters": loaded.num_parameters,
        "parametrisation": config.parametrisation,
        "graph": config.graph.model_dump(),
        "noise": config.noise.model_dump(),
        "tokens": config.tokens.model_dump(),
        "num_genes": config.num_genes,
        "genes_by_position": config.genes_by_position,
        "genes": config.genes,
        "perturbations": config.perturbations,
        "control_label": config.control_label,
        "perturbation_vector_names": None if vectors is None else list(vectors),
        "cell_types": config.cell_types,
        "provenance": config.provenance.model_dump(exclude={"training_args"}),
        "schema_version": config.schema_version,
    }


def _preview(names: list[str], head: int = 5, tail: int = 3) -> str:
    if len(names) <= head + tail:
        return ", ".join(names)
    return ", ".join(names[:head]) + ", ..., " + ", ".join(names[-tail:])


def model_card(loaded: LoadedModel) -> str:
    """A human-readable summary of ``loaded``."""
    config, arch = loaded.config, loaded.config.arch.model_dump()
    tokens, noise = config.tokens, config.noise.model_dump()
    noise_text = ", ".join(f"{k}={v}" for k, v in noise.items() if k != "type")
    shape = ", ".join(f"{k}={v}" for k, v in arch.items())
    rows = [
        ("model", f"{loaded.path} ({loaded.layout})"),
        ("architecture", f"{config.architecture}: {shape}"),
        ("parameters", f"{loaded.num_parameters:,}"),
        ("parametrisation", config.parametrisation),
        ("graph", f"{config.graph.type}, dim {config.graph.dim}"),
        ("noise", f"{noise['type']} ({noise_text})"),
        (
            "vocabulary",
            f"{tokens.vocab_size} tokens: counts 0..{tokens.max_count}"
            + (f", mask {tokens.mask_index}" if tokens.mask_index is not None else ", no mask"),
        ),
        (
            "genes",
            f"{config.num_genes}: {_preview(config.genes)}"
            + (" (named by position; no gene list given)" if config.genes_by_position else ""),
        ),
    ]
    if config.num_perturbations:
        names = config.perturbations
        text = f"{len(names)}: {_preview(names)}" if names else "indices only (no names)"
        rows.append(("perturbations", text))
        rows.append(("control label", str(config.control_label)))
        if loaded.perturbation_vectors is not None:
            vec_names = list(loaded.perturbation_vectors)
            dim = next(iter(loaded.perturbation_vectors.values())).shape[0]
            rows.append(("vectors", f"{len(vec_names)} x {dim}: {_preview(vec_names)}"))
    if config.num_cell_types:
        cell_types = config.cell_types
        rows.append(("cell types", _preview(cell_types) if cell_types else "indices only"))
    prov = config.provenance
    source = f"{prov.source_format or '?'} {prov.source or '?'}"
    if prov.source_file:
        source += f" [{prov.source_file}]"
    rows.append(("source", source))
    for label, value in (
        ("step", prov.step),
        ("ema", prov.ema),
        ("training command", prov.training_command),
        ("data hash", prov.data_hash),
        ("created", prov.created),
        ("source sha256", prov.source_hash if prov.source_hash != loaded.file_hash else None),
    ):
        if value is not None:
            rows.append((label, str(value)))
    rows.append(("sha256", f"{loaded.file_hash} ({loaded.weights_file})"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
