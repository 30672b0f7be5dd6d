"""``sedd generate``: sample cells from any supported checkpoint into an .h5ad file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Literal

import torch
from tqdm import tqdm

from sedd.anndata_io import provenance_uns, write_cells_h5ad
from sedd.checkpoint import LoadedModel
from sedd.commands.checkpoints import add_model_arguments, load_from_args
from sedd.generate import GenerationRequest, generate
from sedd.precision import resolve_precision


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
    p.add_argument("--batch-size", type=int, default=64, help="cells per model forward")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cell-type", help="condition every cell on this cell type")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate cells into an .h5ad file",
        description="Generate cells with the reverse diffusion sampler. Conditional models "
        "generate --cells per condition (default: every condition).",
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
    p.add_argument("--out", type=Path, default=Path("out/generated.h5ad"))
    p.add_argument(
        "--counts-dtype",
        choices=["int", "float32"],
        default="int",
        help="float32 stores the integer counts as floats (for Arc's cell-eval)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    conditions = args.conditions
    if conditions is None and loaded.config.perturbations is not None:
        conditions = list(loaded.config.perturbations)
    request = GenerationRequest(
        cells_per_condition=args.cells,
        conditions=tuple(conditions) if conditions else None,
        cell_type=args.cell_type,
        steps=args.steps,
        sampler=args.sampler,
        temperature=args.temperature,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    return write_generation(loaded, request, args.precision, args.out, args.counts_dtype)


def write_generation(
    loaded: LoadedModel,
    request: GenerationRequest,
    precision_name: str,
    out: Path,
    counts_dtype: Literal["int", "float32"] = "int",
) -> int:
    """Generate with a progress bar, write the h5ad and a metrics JSON, print a summary."""
    request.validate()
    precision = resolve_precision(precision_name, loaded.device)
    n_conditions = len(request.conditions) if request.conditions else 1
    n_cells = request.cells_per_condition * n_conditions
    n_batches = -(-n_cells // request.batch_size)
    with tqdm(total=n_batches * (request.steps + 1), unit="step", desc="sampling") as bar:
        result = generate(loaded, request, precision, on_step=lambda _: bar.update())
    stats = result.stats
    uns = provenance_uns(
        sampler=request.sampler,
        steps=request.steps,
        seed=request.seed,
        temperature=request.temperature,
        precision_record=precision.record(),
        checkpoint_hash=loaded.file_hash,
        timings=stats,
        extra={"model": str(loaded.path), "request": request.__dict__},
    )
    write_cells_h5ad(out, result.counts, result.genes, result.obs, uns, count_dtype=counts_dtype)
    metrics_path = out.with_suffix(".metrics.json")
    summary = {"output": str(out), **stats, "precision": precision.record()}
    metrics_path.write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"wrote {out}: {stats['cells']} cells x {len(result.genes)} genes in "
        f"{stats['seconds']:.1f} s ({stats['cells_per_s']:.2f} cells/s, "
        f"{stats['tokens_per_s']:.0f} tokens/s, {stats['forwards']} forwards, peak memory "
        f"{stats['peak_memory_mib']:.0f} MiB [{stats['peak_memory_kind']}], precision "
        f"{precision.name}, fp32 fallbacks {stats['fp32_fallbacks']}); metrics: {metrics_path}"
    )
    return 0
