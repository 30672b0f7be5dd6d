"""st3-compatible command lines (``scripts/inference_*.py``) over the same library calls as
``sedd generate`` / ``sedd predict``: st3 flag names in, gene-named h5ad out, where st3 puts it.

- ``inference_generation``: ``--num_generate`` cells of an unconditional model ->
  ``<experiment_dir>/inference/generated_cells.h5ad``.
- ``inference_conditional``: ``--num_samples_per_pert`` cells per perturbation, control included
  -> ``<experiment_dir>/inference_results/generated_cells.h5ad``.
- ``inference_perturbseq``: the conditional run for the perturbations of ``--reference_data``'s
  held-out cells, then ``sedd.eval.metrics`` against them -> ``.../inference_results/perturbseq/``.

Each also writes ``generation_metadata.json``. ``--output_dir`` moves the outputs. Precision
defaults to bf16 (st3's setting); on a CPU without native bf16 the precision policy warns that it
is emulated and slow, and ``--precision fp32`` is faster there. ``--num-shards/--shard-index``
(or a SLURM array) write resumable shards into the output directory; ``sedd merge`` joins them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sedd.batch.shards import Shard, ShardError, resolve_shard
from sedd.checkpoints import LoadedModel
from sedd.commands.args import add_shard_arguments
from sedd.commands.loading import load_from_args
from sedd.commands.output import (
    request_from_args,
    run_shard,
    write_one_file,
)
from sedd.defaults import default_device
from sedd.io.files import write_json_atomic
from sedd.request.conditions import perturbation_conditions, read_perturbation_file
from sedd.request.plan import GenerationRequest, plan


def _common_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--experiment_dir", required=True, help="st3 experiment or any sedd model dir")
    p.add_argument("--checkpoint", help="file in the experiment dir (default best > final > epoch)")
    p.add_argument("--genes", help="gene names file (one a line, or an h5ad's var_names)")
    p.add_argument("--config", help="accepted for st3 compatibility; the model's own config rules")
    p.add_argument("--num_steps", type=int, default=50, help="reverse steps (default 50)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="cell i draws from stream (seed, i)")
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32", "auto"], default="bf16")
    p.add_argument("--batch_size", type=int, default=64, help="cells in flight; never changes one")
    p.add_argument("--sampler", choices=["euler", "analytic"], default="euler")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--output_dir", type=Path, help="where outputs go (default: st3's place)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing generated_cells.h5ad (default: refuse, nothing is lost)",
    )
    add_shard_arguments(p)
    return p


def _add_conditional_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--perturbations_file", help="perturbation names, one a line (default: all)")
    p.add_argument("--perturbations_all_file", help="all names in label order (index mapping)")
    p.add_argument("--cond_labels_pt_path", help="perturbation vectors {name: tensor}")
    p.add_argument("--control_name", help="the control label (default: the model's)")
    p.add_argument("--no_control", action="store_true", help="generate no control cells")
    p.add_argument("--cell_type", help="condition every cell on this cell type")
    p.add_argument("--num_samples_per_pert", type=int, default=100)


def _load(args: argparse.Namespace, genes: str | None = None) -> LoadedModel:

    args.model = args.experiment_dir
    args.raw_weights = False
    args.genes = genes if genes is not None else args.genes
    args.perturbation_map = getattr(args, "perturbations_all_file", None)
    args.vectors = getattr(args, "cond_labels_pt_path", None)
    args.device = args.device or default_device()
    return load_from_args(args)


def _sampling_request(
    args: argparse.Namespace, cells_per_condition: int, conditions: list[str] | None
) -> GenerationRequest:
    args.steps = args.num_steps
    args.time_grid = "uniform"  # st3's scripts take N uniform steps
    args.cell_type = getattr(args, "cell_type", None)
    return request_from_args(args, cells_per_condition=cells_per_condition, conditions=conditions)


def _shard(args: argparse.Namespace) -> Shard:
    return resolve_shard(args.num_shards, args.shard_index)


def _write(
    loaded: LoadedModel,
    request: GenerationRequest,
    args: argparse.Namespace,
    out_dir: Path,
    script: str,
    extra: dict[str, Any] | None = None,
) -> Path | None:
    """One file (``out_dir/generated_cells.h5ad`` + metadata), or this process's shard."""
    shard, planned = _shard(args), plan(loaded, request)
    out = out_dir / "generated_cells.h5ad"
    if shard.count == 1 and out.exists() and not args.overwrite:
        raise FileExistsError(
            f"{out} exists (an earlier run's cells); pass --overwrite to replace it, or "
            "--output_dir DIR to write elsewhere."
        )
    if shard.count > 1:
        run_shard(planned, args.precision, out_dir, shard)
        print(
            f"when every shard is done: sedd merge {out_dir} --out {out_dir}/generated_cells.h5ad"
        )
        return None
    summary = write_one_file(planned, args.precision, out)
    metadata = {
        "script": script,
        "argv": sys.argv[1:],
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": str(loaded.path),
        "model_sha256": loaded.file_hash,
        "request": request.record(),
        "output": str(out),
        "num_cells": summary["cells"],
        "genes": len(loaded.config.genes),
        "summary": summary,
        **(extra or {}),
    }
    write_json_atomic(out_dir / "generation_metadata.json", metadata)
    return out


def inference_generation(argv: Sequence[str] | None = None) -> int:
    p = _common_parser("Generate cells from an unconditional model (st3 inference_generation).")
    p.add_argument("--reference_data", help="h5ad whose var_names name the genes (st3)")
    p.add_argument("--num_generate", type=int, default=1000, help="cells to generate")
    p.add_argument("--keep_sparse", action="store_true", help="accepted; sparse is automatic")
    args = p.parse_args(argv)
    loaded = _load(args)
    if loaded.config.genes_by_position and args.reference_data and args.genes is None:
        loaded = _load(args, genes=args.reference_data)  # st3 copies var from the reference
    if loaded.config.num_perturbations:
        raise ValueError(
            f"{args.experiment_dir} is a conditional model; use scripts/inference_conditional.py "
            "(or `sedd predict`)."
        )
    request = _sampling_request(args, args.num_generate, None)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference"
    _write(loaded, request, args, out_dir, "inference_generation")
    return 0


def inference_conditional(argv: Sequence[str] | None = None) -> int:
    p = _common_parser("Generate cells per perturbation (st3 inference_conditional).")
    _add_conditional_flags(p)
    args = p.parse_args(argv)
    names = read_perturbation_file(args.perturbations_file) if args.perturbations_file else None
    loaded = _load(args)
    conditions = perturbation_conditions(
        loaded, names, include_control=not args.no_control, control=args.control_name
    )
    request = _sampling_request(args, args.num_samples_per_pert, conditions)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference_results"
    _write(loaded, request, args, out_dir, "inference_conditional")
    return 0


def inference_perturbseq(argv: Sequence[str] | None = None) -> int:
    p = _common_parser(
        "Predict the perturbations of held-out reference cells and evaluate against them."
    )
    _add_conditional_flags(p)
    p.add_argument("--reference_data", required=True, help="h5ad of real cells (raw counts)")
    p.add_argument(
        "--condition_key",
        help="obs column of the labels (default: first of perturbation, target_gene, gene, "
        "condition, bulk_labels)",
    )
    p.add_argument("--split_key", default="split", help="obs column of the split (if present)")
    p.add_argument("--split_value", default="test", help="held-out value of --split_key")
    p.add_argument("--n_pcs", type=int, default=50, help="PCs for the distribution metrics")
    args = p.parse_args(argv)
    if _shard(args).count > 1:
        raise ShardError(
            "inference_perturbseq evaluates all cells at once; for sharded runs use `sedd "
            "predict --out-dir`, `sedd merge`, then `sedd evaluate`."
        )
    loaded = _load(args)
    from sedd.eval.st3 import held_out_reference, perturbseq_metrics

    reference = held_out_reference(
        args.reference_data, loaded, args.condition_key, args.split_key, args.split_value
    )
    if args.perturbations_file:
        names = read_perturbation_file(args.perturbations_file)
    else:  # the reference's labels the model knows
        known = set(loaded.conditions)
        names = [name for name in reference.labels if name in known]
        if not names:
            raise ValueError(
                f"none of the reference labels in obs[{reference.key!r}] (e.g. "
                f"{reference.labels[:3]}) is a perturbation the model knows."
            )
    conditions = perturbation_conditions(
        loaded, names, include_control=not args.no_control, control=args.control_name
    )
    request = _sampling_request(args, args.num_samples_per_pert, conditions)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference_results" / "perturbseq"
    out = _write(loaded, request, args, out_dir, "inference_perturbseq", reference.describe())
    if out is None:  # cannot happen: one shard was checked above
        raise RuntimeError("inference_perturbseq wrote shards instead of one file.")
    metrics = perturbseq_metrics(reference, out, n_pcs=args.n_pcs, seed=args.seed)
    write_json_atomic(out_dir / "metrics.json", metrics)
    overall = metrics["overall"]
    shown = ", ".join(
        f"{key} {overall[key]:.4g}"
        for key in ("gene_mean_pearson", "mmd2_rbf", "energy_distance", "knn_auc")
        if isinstance(overall.get(key), float)
    )
    print(
        f"evaluated against {reference.n_cells} held-out cells: {shown}; "
        f"metrics: {out_dir / 'metrics.json'}"
    )
    return 0


def script_main(entry: Callable[[Sequence[str] | None], int]) -> None:
    """Run a script entry point; user errors print one line and exit 2 (like ``sedd``)."""
    try:
        code = entry(None)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)
