"""``sedd generate``: sample cells from any supported checkpoint into an .h5ad file."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sedd.commands.checkpoints import add_model_arguments, load_from_args
from sedd.commands.output import add_output_arguments, request_from_args, run_request


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Sampling options shared by ``generate`` and ``predict``."""
    p.add_argument("--steps", type=int, default=50, help="reverse steps (default 50)")
    p.add_argument("--sampler", choices=["euler", "analytic"], default="euler")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="cell i draws from stream (seed, i)")
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "bf16", "fp16", "fp32"],
        help="autocast dtype of the model forward (auto: bf16 where it is fast)",
    )
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
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cell-type", help="condition every cell on this cell type")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate cells into an .h5ad file (or resumable shards)",
        description="Generate cells with the reverse diffusion sampler. Conditional models "
        "generate --cells per condition (default: every condition). With --out-dir, this "
        "process runs one shard (--num-shards/--shard-index, default from the SLURM array) and "
        "`sedd merge DIR --out FILE` joins them.",
    )
    add_model_arguments(p)
    p.add_argument("--cells", type=int, default=100, help="cells per condition (default 100)")
    p.add_argument(
        "--conditions",
        nargs="+",
        metavar="NAME",
        help="perturbation/condition names (default: all the model knows)",
    )
    add_sampling_arguments(p)
    add_output_arguments(p, default_out=Path("out/generated.h5ad"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    conditions = args.conditions
    if conditions is None and loaded.config.perturbations is not None:
        conditions = list(loaded.config.perturbations)
    request = request_from_args(args, cells_per_condition=args.cells, conditions=conditions)
    run_request(loaded, request, args)
    return 0
