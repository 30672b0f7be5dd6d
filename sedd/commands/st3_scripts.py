"""st3-compatible command lines (``scripts/inference_*.py``) over the same library calls as
``sedd generate`` / ``sedd predict``: st3 flag names in, gene-named h5ad out, where st3 puts it.

- ``inference_generation``: ``--num_generate`` cells of an unconditional model ->
  ``<experiment_dir>/inference/generated_cells.h5ad`` (or st3's ``--output_path``).
- ``inference_conditional``: ``--num_samples_per_pert`` cells per perturbation, control included
  -> ``<experiment_dir>/inference_results/generated_cells.h5ad``; ``--evaluate`` then runs
  ``sedd evaluate`` against ``--test_data_path``.
- ``inference_perturbseq``: the conditional run for the perturbations of ``--reference_data``'s
  held-out cells, then ``sedd.eval.metrics`` against them -> ``.../inference_results/perturbseq/``.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.commands.args import add_progress_argument, add_shard_arguments
from sedd.commands.loading import load_from_args
from sedd.commands.output import (
    check_h5ad_name,
    claim_output,
    request_from_args,
    run_shard,
    settings_from_args,
    write_one_file,
)
from sedd.commands.st3_flags import (
    Script,
    add_st3_flags,
    config_path,
    in_script_words,
    notes_for,
    read_st3_config,
    words_as_flags,
)
from sedd.defaults import default_device
from sedd.io.files import refuse_existing, write_json_atomic
from sedd.request.conditions import perturbation_conditions, read_perturbation_file
from sedd.request.plan import GenerationRequest, plan
from sedd.shards.ranges import Shard, ShardError, resolve_shard

METADATA = "generation_metadata.json"
OVERWRITE = "--overwrite (job scripts: OVERWRITE=1)"


def _parser(script: Script, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)
    add_st3_flags(p, script)
    own = p.add_argument_group("sedd options (not st3's)")
    own.add_argument("--genes", help="gene names file (one a line, or an h5ad's var_names)")
    own.add_argument("--precision", choices=["bf16", "fp16", "fp32", "auto"], default="bf16",
                     help="default bf16, st3's")  # fmt: skip
    own.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    own.add_argument("--output_dir", type=Path, help="where outputs go (default: st3's place)")
    own.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing result (default: refuse before sampling; nothing is lost)",
    )
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


def _shard(args: argparse.Namespace) -> Shard:
    return resolve_shard(args.num_shards, args.shard_index)


def _metadata_path(out: Path) -> Path:
    """st3's ``generation_metadata.json`` beside ``generated_cells.h5ad``; beside a file named
    otherwise (``--output_path``), ``<stem>.generation_metadata.json``."""
    if out.name == "generated_cells.h5ad":
        return out.parent / METADATA
    return out.with_name(f"{out.stem}.{METADATA}")


def _refuse_early(out: Path, args: argparse.Namespace) -> Path:
    """``out``, or the refusal to replace it (or to name it other than .h5ad), before the model
    is even loaded."""
    check_h5ad_name(out, "--output_path")
    refuse_existing(out, overwrite=args.overwrite, flag=OVERWRITE)
    return out


def _claim(out: Path, args: argparse.Namespace, also: tuple[Path, ...] = ()) -> None:
    """Before any sampling: refuse when ``out`` holds an earlier run's cells (unless
    ``--overwrite``); when it does and may be replaced, the records that describe the old cells
    go first, so no moment leaves metadata of one run beside the cells of another."""
    claim_output(out, args.overwrite, flag="--output_path", overwrite_flag=OVERWRITE,
                 also=(_metadata_path(out), *also))  # fmt: skip


_SHARD_FLAGS = ("--num-shards", "--num_shards", "--shard-index", "--shard_index")


def _argv() -> list[str]:
    """The command line without the shard flags (the same for every shard of a run)."""
    argv, words = [], iter(sys.argv[1:])
    for word in words:
        if word in _SHARD_FLAGS:
            next(words, None)  # its value
        elif word.split("=", 1)[0] not in _SHARD_FLAGS:
            argv.append(word)
    return argv


def _write(
    loaded: LoadedModel,
    request: GenerationRequest,
    args: argparse.Namespace,
    out: Path,
    script: str,
    extra: dict[str, Any] | None = None,
    also: tuple[Path, ...] = (),
) -> Path | None:
    """One file (``out`` + metadata), or this process's shard of the directory ``out`` will be
    merged from. A sharded run writes its metadata first (every shard the same, naming the
    request whose merged shards become ``out``); a sharded run with ``--overwrite`` removes the
    old ``out`` too, which the merge would replace."""
    shard, planned = _shard(args), plan(loaded, request)
    _claim(out, args, also + ((out,) if shard.count > 1 else ()))
    metadata = {
        "script": script,
        "argv": _argv(),
        "args": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v)
                 for k, v in vars(args).items() if k not in ("shard_index", "num_shards")},
        "model": str(loaded.path),
        "model_sha256": loaded.file_hash,
        "request": request.record(),
        "output": str(out),
        "genes": len(loaded.config.genes),
        "num_cells": len(planned),
        **(extra or {}),
    }  # fmt: skip
    if shard.count > 1:
        metadata.update(status="sharded: merged by `sedd merge`", num_shards=shard.count)
        write_json_atomic(_metadata_path(out), metadata)
        run_shard(
            planned, args.precision, out.parent, shard, settings=settings_from_args(args),
            progress=args.progress,
        )  # fmt: skip
        print(f"when every shard is done: sedd merge {out.parent} --out {out}")
        return None
    summary = write_one_file(
        planned, args.precision, out, settings=settings_from_args(args), progress=args.progress
    )
    metadata.update(num_cells=summary["cells"], summary=summary)
    write_json_atomic(_metadata_path(out), metadata)
    return out


def inference_generation(argv: Sequence[str] | None = None) -> int:
    p = _parser(
        "generation", "Generate cells of an unconditional model (st3 inference_generation)."
    )
    args = _parse(p, "generation", argv)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference"
    out = _refuse_early(
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
    _write(loaded, request, args, out, "inference_generation")
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


def _evaluation_args(args: argparse.Namespace) -> Path | None:
    """``--test_data_path`` when ``--evaluate`` asks for it, checked before any sampling."""
    if not args.evaluate:
        return None
    if args.test_data_path is None:
        raise ValueError("--evaluate needs --test_data_path FILE.h5ad (or data.test_data_path in "
                         "--config): the real cells to compare with.")  # fmt: skip
    test = Path(args.test_data_path)
    if not test.is_file():
        raise FileNotFoundError(f"--test_data_path {test}: file not found.")
    if _shard(args).count > 1:
        print("--evaluate: a sharded run is evaluated after `sedd merge DIR --out FILE`, by "
              "`python -m sedd.commands.st3_scripts FILE` (the job scripts do so).")  # fmt: skip
    return test


def _check_evaluation(loaded: LoadedModel, test: Path, args: argparse.Namespace) -> None:
    """Before any sampling: the test cells carry ``--gene`` and share genes with the model."""
    import anndata  # slow to import; only --evaluate needs it here

    real = anndata.read_h5ad(test, backed="r")
    try:
        genes, columns = set(map(str, real.var_names)), list(real.obs.columns)
    finally:
        real.file.close()
    if args.gene not in columns:
        raise ValueError(f"--evaluate: --test_data_path {test} has no obs column {args.gene!r} "
                         f"(--gene, or data.gene in --config); its columns: {columns[:12]}. "
                         "Checked before sampling: nothing was generated.")  # fmt: skip
    shared = sum(g in genes for g in loaded.config.genes)
    if shared < 2:
        hint = ("the model's genes are named by position ('0', '1', ...): pass --genes FILE "
                "(job scripts: GENES_FILE) listing the training genes in order"
                if loaded.config.genes_by_position else
                "pass test cells measured on the model's genes")  # fmt: skip
        raise ValueError(f"--evaluate: --test_data_path {test} shares {shared} gene names with "
                         f"the model ({len(loaded.config.genes)} genes, e.g. "
                         f"{loaded.config.genes[:3]}); {hint}. Checked before sampling: nothing "
                         "was generated.")  # fmt: skip


def _evaluate_existing(out: Path, test: Path, args: argparse.Namespace) -> bool:
    """``--evaluate`` when the result exists and ``--overwrite`` was not given: evaluate it as
    it is (no resampling), saying which run wrote it."""
    if args.overwrite or not out.is_file() or _shard(args).count > 1:
        return False
    meta = _metadata_path(out)
    recorded = json.loads(meta.read_text()).get("argv") if meta.is_file() else None
    wrote = f" (written by: {shlex.join(recorded)})" if isinstance(recorded, list) else ""
    print(f"--evaluate: {out} exists{wrote}; evaluating it without sampling again (pass "
          f"{OVERWRITE} to sample anew).")  # fmt: skip
    _evaluate(test, out, args)
    return True


def _evaluate(test: Path, out: Path, args: argparse.Namespace) -> None:
    """``sedd evaluate --real TEST --generated OUT --st3-metrics``, st3's ``--gene`` naming the
    test labels: sedd's metrics, and st3's ``generation_metrics_*`` files beside them."""
    from sedd.commands import evaluate

    root = argparse.ArgumentParser(allow_abbrev=False)
    evaluate.register(root.add_subparsers())
    cmd = ["evaluate", "--real", str(test), "--generated", str(out),
           "--real-condition-key", args.gene, "--condition-key", "perturbation",
           "--seed", str(args.seed), "--st3-metrics"]  # fmt: skip
    print(f"--evaluate: sedd {' '.join(cmd)}")
    parsed = root.parse_args(cmd)
    parsed.func(parsed)


def inference_conditional(argv: Sequence[str] | None = None) -> int:
    p = _parser("conditional", "Generate cells per perturbation (st3 inference_conditional).")
    args = _parse(p, "conditional", argv)
    names, test = _names(args), _evaluation_args(args)
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference_results"
    if test is not None and _evaluate_existing(out_dir / "generated_cells.h5ad", test, args):
        return 0
    out = _refuse_early(out_dir / "generated_cells.h5ad", args)
    loaded = _load(args)
    if test is not None:
        _check_evaluation(loaded, test, args)
    request = _sampling_request(args, args.num_samples_per_pert, _conditions(loaded, names, args))
    skipped = {"skipped_perturbations": args.skipped_perturbations}
    written = _write(loaded, request, args, out, "inference_conditional", skipped)
    if args.skipped_perturbations:
        print(f"skipped (not known to the model): {args.skipped_perturbations[:20]}")
    if written and test is not None:
        _evaluate(test, out, args)
    return 0


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
    if _shard(args).count > 1:
        raise ShardError(
            "inference_perturbseq evaluates all cells at once; for sharded runs use `sedd "
            "predict --out-dir`, `sedd merge`, then `sedd evaluate`."
        )
    out_dir = args.output_dir or Path(args.experiment_dir) / "inference_results" / "perturbseq"
    out = _refuse_early(out_dir / "generated_cells.h5ad", args)
    loaded = _load(args)
    from sedd.eval.st3 import held_out_reference, perturbseq_metrics

    reference = held_out_reference(
        args.reference_data, loaded, args.condition_key, args.split_key, args.split_value
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
    extra, metrics_file = reference.describe(), out_dir / "metrics.json"
    extra["skipped_perturbations"] = args.skipped_perturbations
    _write(loaded, request, args, out, "inference_perturbseq", extra, also=(metrics_file,))
    metrics = perturbseq_metrics(reference, out, n_pcs=args.n_pcs, seed=args.seed)
    write_json_atomic(metrics_file, metrics)
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


def evaluate_merged(argv: Sequence[str] | None = None) -> int:
    """``--evaluate`` for a sharded run, after ``sedd merge``: the test set and label column
    are the ones its ``generation_metadata.json`` recorded (from flags or ``--config``)."""
    p = argparse.ArgumentParser(description=evaluate_merged.__doc__, allow_abbrev=False)
    p.add_argument("merged", type=Path, help="the merged generated_cells.h5ad")
    merged = p.parse_args(argv).merged
    meta = _metadata_path(merged)
    if not meta.is_file():
        raise FileNotFoundError(f"{meta} not found: {merged} was not written by an st3 script.")
    recorded = json.loads(meta.read_text())["args"]
    args = argparse.Namespace(**{k: recorded.get(k) for k in ("gene", "seed", "evaluate")})
    args.test_data_path = recorded.get("test_data_path")
    args.num_shards = args.shard_index = None
    args.evaluate = True
    _evaluate(_evaluation_args(args), merged, args)
    return 0


_SCRIPTS: dict[str, Script] = {
    "inference_generation": "generation",
    "inference_conditional": "conditional",
    "inference_perturbseq": "perturbseq",
}


def script_main(entry: Callable[[Sequence[str] | None], int]) -> None:
    """Run a script entry point; user errors print one line and exit 2 (like ``sedd``), naming
    the script's own flags and job-script variables, not sedd's."""
    try:
        code = entry(None)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        message = in_script_words(str(exc), _SCRIPTS.get(entry.__name__, "conditional"))
        print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
        code = 2
    raise SystemExit(code)


if __name__ == "__main__":  # the job scripts' EVALUATE=true after a sharded run's merge
    script_main(evaluate_merged)
