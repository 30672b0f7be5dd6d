"""``--evaluate`` of the st3-compatible scripts: checked before any sampling (the test file,
its ``--gene`` column, genes shared with the model), then ``sedd evaluate`` with st3's metric
files; an existing result is evaluated as it is. ``python -m sedd.commands.st3_evaluate FILE``
evaluates a sharded run after its merge (the job scripts' ``EVALUATE=true``)."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from sedd.checkpoints import LoadedModel
from sedd.commands.st3_outputs import OVERWRITE, metadata_path, shard_of
from sedd.commands.st3_words import script_main


def evaluation_args(args: argparse.Namespace) -> Path | None:
    """``--test_data_path`` when ``--evaluate`` asks for it, checked before any sampling."""
    if not args.evaluate:
        return None
    if args.test_data_path is None:
        raise ValueError("--evaluate needs --test_data_path FILE.h5ad (or data.test_data_path in "
                         "--config): the real cells to compare with.")  # fmt: skip
    test = Path(args.test_data_path)
    if not test.is_file():
        raise FileNotFoundError(f"--test_data_path {test}: file not found.")
    if shard_of(args).count > 1:
        print("--evaluate: a sharded run is evaluated after `sedd merge DIR --out FILE`, by "
              "`python -m sedd.commands.st3_evaluate FILE` (the job scripts do so).")  # fmt: skip
    return test


def check_evaluation(loaded: LoadedModel, test: Path, args: argparse.Namespace) -> None:
    """Before any sampling: the test cells carry ``--gene`` and share genes with the model."""
    from sedd.io.read import read_h5ad_safely  # slow to import (anndata); only --evaluate

    real = read_h5ad_safely(test, what="--test_data_path", backed="r")
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


def evaluate_existing(out: Path, test: Path, args: argparse.Namespace) -> bool:
    """``--evaluate`` when the result exists and ``--overwrite`` was not given: evaluate it as
    it is (no resampling), saying which run wrote it."""
    if args.overwrite or not out.is_file() or shard_of(args).count > 1:
        return False
    meta = metadata_path(out)
    recorded = json.loads(meta.read_text()).get("argv") if meta.is_file() else None
    wrote = f" (written by: {shlex.join(recorded)})" if isinstance(recorded, list) else ""
    print(f"--evaluate: {out} exists{wrote}; evaluating it without sampling again (pass "
          f"{OVERWRITE} to sample anew).")  # fmt: skip
    evaluate_result(test, out, args)
    return True


def evaluate_result(test: Path, out: Path, args: argparse.Namespace) -> None:
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


def evaluate_merged(argv: Sequence[str] | None = None) -> int:
    """``--evaluate`` for a sharded run, after ``sedd merge``: the test set and label column
    are the ones its ``generation_metadata.json`` recorded (from flags or ``--config``)."""
    p = argparse.ArgumentParser(description=evaluate_merged.__doc__, allow_abbrev=False)
    p.add_argument("merged", type=Path, help="the merged generated_cells.h5ad")
    merged = p.parse_args(argv).merged
    meta = metadata_path(merged)
    if not meta.is_file():
        raise FileNotFoundError(f"{meta} not found: {merged} was not written by an st3 script.")
    recorded = json.loads(meta.read_text())["args"]
    args = argparse.Namespace(**{k: recorded.get(k) for k in ("gene", "seed", "evaluate")})
    args.test_data_path = recorded.get("test_data_path")
    args.num_shards = args.shard_index = None
    args.evaluate = True
    evaluate_result(evaluation_args(args), merged, args)
    return 0


if __name__ == "__main__":  # the job scripts' EVALUATE=true after a sharded run's merge
    script_main(evaluate_merged)
