"""Load the model the ``sedd.commands.args`` model options name (imported when a command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sedd.checkpoints import CheckpointNotFoundError, LoadedModel, load_checkpoint
from sedd.defaults import DEFAULT_MODEL, default_device


def resolve_device(device: str | None) -> str:
    """``None`` -> ``cuda`` when available, else ``cpu``."""
    if device is None:
        return default_device()
    return device


def load_source(args: argparse.Namespace, source: str | Path) -> LoadedModel:
    """Load ``source`` as the ``add_source_options`` options in ``args`` say."""
    # loader warnings (unnamed genes, ...) reach the user through sedd.cli's one printer
    return load_checkpoint(
        source,
        checkpoint=args.checkpoint,
        use_ema=not args.raw_weights,
        genes=args.genes,
        perturbations=args.perturbation_map,
        vectors=args.vectors,
        device=resolve_device(getattr(args, "device", None)),
    )


def load_from_args(args: argparse.Namespace, default: Path = DEFAULT_MODEL) -> LoadedModel:
    """Load the model named by ``add_model_arguments`` options (``default`` if none)."""
    source = args.model
    if source is None:
        if not default.exists():
            raise CheckpointNotFoundError(
                f"no model given and the bundled default model at {default} is missing; "
                "pass --model PATH."
            )
        source = default
    return load_source(args, source)
