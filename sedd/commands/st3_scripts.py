"""st3-compatible command lines (``scripts/inference_*.py``) over the same library calls as
``sedd generate`` / ``sedd predict``: st3 flag names in, gene-named h5ad out, where st3 puts it.

- ``inference_generation``: ``--num_generate`` cells of an unconditional model ->
  ``<experiment_dir>/inference/generated_cells.h5ad`` (or st3's ``--output_path``).
- ``inference_conditional``: ``--num_samples_per_pert`` cells per perturbation, control included
  -> ``<experiment_dir>/inference_results/generated_cells.h5ad``; ``--evaluate`` then runs
  ``sedd evaluate`` against ``--test_data_path``.
- ``inference_perturbseq``: the conditional run for the perturbations of ``--reference_data``'s
  held-out cells -> ``<experiment_dir>/perturbseq_inference_results/`` (st3's place): st3's
  ``metrics.json`` (each predicted cell against a held-out cell of its perturbation, in bins)
  and sedd's ``distribution_metrics.json`` (``sedd.eval.metrics`` against the held-out cells).

Every st3 flag and ``--config`` YAML key is in ``sedd.commands.st3_flags.ST3_FLAGS``, with st3's
defaults and precedence (command line > YAML > default). Each run also writes
``generation_metadata.json`` beside its file; a file (or, for sharded runs, the merged file) that
exists is never replaced without ``--overwrite``, checked before sampling, and a replaced file's
old metadata is removed before the new cells are written, so the two always describe one run.
Precision defaults to bf16 (st3's setting); on a CPU without native bf16 the precision policy
warns that it is emulated and slow, and ``--precision fp32`` is faster there.
``--num-shards/--shard-index`` (or a SLURM array) write resumable shards into the output
directory; ``sedd merge`` joins them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.commands.args import add_progress_argument, add_shard_arguments
from sedd.commands.loading import load_from_args
from sedd.commands.output import request_from_args
from sedd.commands.st3_config import config_path, read_st3_config
from sedd.commands.st3_evaluate import (
    check_evaluation,
    evaluate_existing,
    evaluate_result,
    evaluation_args,
)
from sedd.commands.st3_flags import Script, add_st3_flags, notes_for
from sedd.commands.st3_outputs import refuse_early, shard_of, write_result
from sedd.commands.st3_words import words_as_flags
from sedd.defaults import default_device
from sedd.io.files import write_bytes_atomic, write_json_atomic
from sedd.request.conditions import perturbation_conditions, read_perturbation_file
from sedd.request.plan import GenerationRequest
from sedd.shards.ranges import ShardError

PERTURBSEQ_DIR = "perturbseq_inference_results"  # st3's results directory


def own_arguments(
    p: argparse.ArgumentParser,
    *,
    precision: str = "bf16",
    precision_help: str = "default bf16, st3's",
    genes_help: str = "gene names file (one a line, or an h5ad's var_names)",
) -> argparse._ArgumentGroup:
    """The options every st3-compatible script adds to st3's (``--genes``, ``--precision``,
    ``--device``, ``--overwrite``), in their own group; a script adds its others to it."""
    own = p.add_argument_group("sedd options (not st3's)")
    own.add_argument("--genes", help=genes_help)
    own.add_argument("--precision", choices=["bf16", "fp16", "fp32", "auto"], default=precision,
                     help=precision_help)  # fmt: skip
    own.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    own.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result (default: refuse before sampling; nothing is lost)",
    )
    return own


def _parser(script: Script, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)
    add_st3_flags(p, script)
    own = own_arguments(p)
    own.add_argument("--output_dir", type=Path, help="where outputs go (default: st3's place)")
    if script != "generation":
        own.add_argument("--cell_type", help="condition every cell on this cell type")
        own.add_argument("--no_control", action="store_true", help="generate no control cells")
    add_shard_arguments(own)
    add_progress_argument(own)
    return p


def _parse(p: argparse.ArgumentParser, script: Script, argv: Sequence[str] | None) -> Any:
    """st3's two-pass parse: ``--config``'s YAML sets defaults, the command line wins. Prints one
    note per st3-only flag that was set, and one for the YAML keys nothing reads."""
    argv, words = words_as_flags(list(sys.argv[1:] if argv is None else argv), p)
    if words:  # DCM's README form: KEY=VALUE words; say once what they were read as
        print(f"note: read as: {Path(p.prog).name} {shlex.join(argv)}", file=sys.stderr)
    base = {a.dest: a.default for a in p._actions}
    config, from_yaml, unused = config_path(argv), {}, []
    if config is not None:
        from_yaml, unused = read_st3_config(config, script, p)
        p.set_defaults(**from_yaml)
    args = p.parse_args(argv)
    given = {dest for dest, default in base.items() if getattr(args, dest, default) != default}
    args.from_yaml = set(from_yaml)
    args.script = script
    for note in notes_for(script, given | set(from_yaml)):
        print(f"note: {note}", file=sys.stderr)
    if unused:
        print(f"note: --config {config}: not read by this script (st3's neither): "
              f"{', '.join(unused)}", file=sys.stderr)  # fmt: skip
    return args


def _load(args: argparse.Namespace, genes: str | None = None) -> LoadedModel:
    args.model = args.experiment_dir
    args.raw_weights = False
    args.genes = genes if genes is not None else args.genes
    args.perturbation_map = getattr(args, "perturbations_all_file", None)
    args.vectors = getattr(args, "cond_labels_pt_path", None)
    args.device = args.device or default_device()
    if args.checkpoint is not None and Path(args.checkpoint).is_file():
        args.checkpoint = str(Path(args.checkpoint).resolve())  # st3: as given, from the cwd
    return load_from_args(args)


def _sampling_request(
    args: argparse.Namespace, cells_per_condition: int, conditions: list[str] | None
) -> GenerationRequest:
    args.steps = args.num_steps
    args.time_grid = "uniform"  # st3's scripts take N uniform steps
    args.cell_type = getattr(args, "cell_type", None)
    return request_from_args(args, cells_per_condition=cells_per_condition, conditions=conditions)


def inference_generation(argv: Sequence[str] | None = None) -> int:
    p = _parser(
        "generation", "Generate cells of an unconditional model (st3 inference_generation)."
    )
    args = _parse(p, "generation", argv)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference"
    out = refuse_early(
        Path(args.output_path) if args.output_path else out_dir / "generated_cells.h5ad", args
    )
    loaded = _load(args)
    if loaded.config.genes_by_position and args.reference_data and args.genes is None:
        loaded = _load(args, genes=args.reference_data)  # st3 copies var from the reference
    if loaded.config.num_perturbations:
        raise ValueError(
            f"{args.experiment_dir} is a conditional model; use scripts/inference_conditional.py "
            "(or `sedd predict`)."
        )
    request = _sampling_request(args, args.num_generate, None)
    write_result(loaded, request, args, out, "inference_generation")
    return 0


def _names(args: argparse.Namespace) -> list[str] | None:
    """The perturbations asked for: ``--perturbations`` or ``--perturbations_file`` (one of the
    two on the command line; the command line's wins over the YAML's file)."""
    listed, file = getattr(args, "perturbations", None), args.perturbations_file
    if listed and file and "perturbations_file" not in args.from_yaml:
        raise ValueError(
            f"--perturbations {' '.join(listed)} and --perturbations_file {file} both name the "
            "perturbations to generate; pass one of them."
        )
    if listed:
        return list(listed)
    return read_perturbation_file(file) if file else None


def _known(loaded: LoadedModel, names: list[str], args: Any) -> list[str]:
    """``names`` the model knows, once each, in order. Like st3, the others are warned about and
    skipped (a test list may name perturbations training never saw); they are kept in
    ``args.skipped_perturbations`` for the metadata. None known: the error, with suggestions."""
    known = set(loaded.conditions)
    unknown = [n for n in dict.fromkeys(names) if n not in known]
    if names and len(unknown) == len(set(names)):
        loaded.perturbation_labels(names[:1])
    if unknown:
        print(f"warning: skipped {len(unknown)} perturbation(s) the model does not know (st3 "
              f"skips them too): {unknown[:20]}", file=sys.stderr)  # fmt: skip
    args.skipped_perturbations = unknown
    return [n for n in dict.fromkeys(names) if n in known]


def _conditions(loaded: LoadedModel, names: list[str] | None, args: Any) -> list[str]:
    """st3's: exactly the perturbations listed, in their order (the control only where it is
    listed); with no list, every label of the model, control first (unless ``--no_control``)."""
    args.skipped_perturbations = []
    if names is None:
        return perturbation_conditions(
            loaded, None, include_control=not args.no_control, control=args.control_name
        )
    names = _known(loaded, names, args)
    if args.control_name is not None:
        loaded.perturbation_labels([args.control_name])
    control = args.control_name or loaded.config.control_label
    chosen = [n for n in names if not (args.no_control and n == control)]
    if not chosen:
        raise ValueError(f"nothing to generate: the only perturbation listed is the control "
                         f"{control!r}, and --no_control leaves it out.")  # fmt: skip
    return chosen


def inference_conditional(argv: Sequence[str] | None = None) -> int:
    p = _parser("conditional", "Generate cells per perturbation (st3 inference_conditional).")
    args = _parse(p, "conditional", argv)
    names, test = _names(args), evaluation_args(args)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference_results"
    if test is not None and evaluate_existing(out_dir / "generated_cells.h5ad", test, args):
        return 0
    out = refuse_early(out_dir / "generated_cells.h5ad", args)
    loaded = _load(args)
    if test is not None:
        check_evaluation(loaded, test, args)
    request = _sampling_request(args, args.num_samples_per_pert, _conditions(loaded, names, args))
    written = write_result(loaded, request, args, out, "inference_conditional",
                           _st3_metadata(loaded, request, args))  # fmt: skip
    if args.skipped_perturbations:
        print(f"skipped (not known to the model): {args.skipped_perturbations[:20]}")
    if written and test is not None:
        evaluate_result(test, out, args)
    return 0


def _checkpoint_file(loaded: LoadedModel) -> Path:
    """The weights file the cells came from (st3 records the checkpoint it loaded)."""
    source = loaded.config.provenance
    if source.source and source.source_file:
        return Path(source.source) / source.source_file
    return Path(loaded.path)


def _st3_metadata(
    loaded: LoadedModel, request: GenerationRequest, args: argparse.Namespace
) -> dict[str, Any]:
    """The keys st3's and DCM's ``generation_metadata.json`` hold (beside sedd's own), and the
    perturbations skipped as unknown."""
    conditions = list(request.conditions or ())
    cell_type = args.cell_type
    return {
        "num_perturbations": len(conditions),
        "num_samples_per_pert": args.num_samples_per_pert,
        "num_steps": args.num_steps,
        "temperature": args.temperature,
        "perturbations": conditions,
        "checkpoint": str(_checkpoint_file(loaded)),
        "cell_type": cell_type,
        "cell_type_idx": None if cell_type is None else loaded.cell_type_index(cell_type),
        "skipped_perturbations": args.skipped_perturbations,
    }


def _label_column(args: argparse.Namespace) -> str | None:
    """The held-out cells' label column: ``--condition_key``, else st3's ``--gene`` when it was
    set (flag or ``data.gene``), else found among the usual names."""
    if args.condition_key:
        return str(args.condition_key)
    return str(args.gene) if args.gene != "perturbation" or "gene" in args.from_yaml else None


def inference_perturbseq(argv: Sequence[str] | None = None) -> int:
    p = _parser(
        "perturbseq",
        "Predict the perturbations of held-out reference cells and evaluate against them.",
    )
    p.add_argument(
        "--reference_data", help="h5ad of real cells (raw counts); st3's name: --data_path"
    )
    p.add_argument(
        "--condition_key",
        help="obs column of the labels (default: first of perturbation, target_gene, gene, "
        "condition, bulk_labels)",
    )
    p.add_argument("--split_key", default="split", help="obs column of the split (if present)")
    p.add_argument("--split_value", default="test", help="held-out value of --split_key")
    p.add_argument("--n_pcs", type=int, default=50, help="PCs for the distribution metrics")
    args = _parse(p, "perturbseq", argv)
    both = args.reference_data and args.data_path and "data_path" not in args.from_yaml
    if both and Path(args.reference_data) != Path(args.data_path):
        raise ValueError(f"--reference_data {args.reference_data} and --data_path "
                         f"{args.data_path} name two files; pass one.")  # fmt: skip
    args.reference_data = args.reference_data or args.data_path
    if not args.reference_data:
        raise ValueError("the held-out real cells are needed: pass --data_path FILE.h5ad (or "
                         "data.test_data_path in --config).")  # fmt: skip
    if shard_of(args).count > 1:
        raise ShardError(
            "inference_perturbseq evaluates all cells at once; for sharded runs use `sedd "
            "predict --out-dir`, `sedd merge`, then `sedd evaluate`."
        )
    out_dir = args.output_dir or Path(args.experiment_dir) / PERTURBSEQ_DIR
    out = refuse_early(out_dir / "generated_cells.h5ad", args)
    loaded = _load(args)
    from sedd.eval.st3 import held_out_reference, perturbseq_metrics, st3_paired_scores

    reference = held_out_reference(
        args.reference_data, loaded, _label_column(args), args.split_key, args.split_value
    )
    names = _names(args)
    args.skipped_perturbations = []
    if names is not None:
        names = _known(loaded, names, args)
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
    extra = reference.describe()
    extra["skipped_perturbations"] = args.skipped_perturbations
    st3_file, ours_file = out_dir / "metrics.json", out_dir / "distribution_metrics.json"
    also = (st3_file, ours_file)
    write_result(loaded, request, args, out, "inference_perturbseq", extra, also=also)
    paired = st3_paired_scores(reference, out)
    st3_metrics = {  # st3's keys, in st3's order
        **{key: paired[key] for key in ("exact_cell_match", "per_gene_accuracy", "mae_bins")},
        "within_k": paired["within_k"], "num_steps": args.num_steps,
        "temperature": args.temperature, "num_cells": paired["num_cells"],
        "checkpoint": args.checkpoint or str(loaded.weights_file or loaded.path),
    }  # fmt: skip
    write_bytes_atomic(st3_file, json.dumps(st3_metrics, indent=2).encode())  # st3: no newline
    metrics = perturbseq_metrics(reference, out, n_pcs=args.n_pcs, seed=args.seed)
    write_json_atomic(ours_file, metrics)
    overall = metrics["overall"]
    shown = ", ".join(
        f"{key} {overall[key]:.4g}"
        for key in ("gene_mean_pearson", "mmd2_rbf", "energy_distance", "knn_auc")
        if isinstance(overall.get(key), float)
    )
    print(
        f"st3's scores over {paired['num_cells']} paired cells: exact cell match "
        f"{paired['exact_cell_match']:.2%}, per-gene accuracy {paired['per_gene_accuracy']:.2%}, "
        f"MAE {paired['mae_bins']:.2f} bins ({st3_file})"
    )
    print(f"evaluated against {reference.n_cells} held-out cells: {shown}; metrics: {ours_file}")
    return 0
