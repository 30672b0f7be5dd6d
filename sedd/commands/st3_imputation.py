"""st3-compatible ``scripts/inference_imputation.py``: hide a fraction of real cells' counts,
impute them through the engine (``sedd impute``'s path) and score them as st3 does.

As in st3 (every flag and YAML key: the imputation rows of ``sedd.commands.st3_flags``):

- cells: the rows of ``--data_path``, split as st3's ``train_val_split`` splits them (a
  ``torch.randperm`` seeded with ``--seed``; the last ``int(n * --val_fraction)`` are imputed, or
  the others with ``--use_train_split``); with ``--num_batches``, the first
  ``num_batches * --batch_size`` of them (st3's unshuffled loader);
- mask: each entry of those cells (every gene, zero counts included) is hidden with probability
  ``--mask_ratio``; the hidden entries are imputed, every other one is kept;
- score, over the hidden entries, in bins (a token is the count): exact-match accuracy, mean
  absolute error and the fraction within 1, 3, 5 and 10 bins, as float32 means.

Written to ``<experiment_dir>/imputation_results/`` (or ``--output_dir``), st3's files as st3
writes them::

    accuracy.txt        "0.812500\\n"                  the accuracy, 6 decimals
    mae.json            '{"mae_bins": 0.250000}\\n'
    within_{k}.csv      "within_1,0.937500\\n"          k = 1, 3, 5, 10
    metrics.json        accuracy, mae_bins, within_k {"1", "3", "5", "10"}, mask_ratio, num_steps,
                        temperature, num_masked_positions, checkpoint (json, indent 2)
    cell_{i}_acc.txt, cell_{i}_mae.json   the same for each of the first --num_cells_visualize

and sedd's: ``imputed_cells.h5ad`` (X: the imputed counts; ``layers["real_counts"]`` and
``layers["imputation_mask"]``, 1 where an entry was hidden and scored; ``obs["data_row"]``, the
cell's row in ``--data_path``; ``uns["st3_imputation"]``, the scores), with
``imputed_cells.generation_metadata.json`` and ``imputed_cells.metrics.json`` beside it. st3's
plots (``imputation_scatter_hist.png``, ``single_cell_{i}.png``) are not drawn.

Unlike st3, a cell's mask is a pure function of (``--seed``, its row in ``--data_path``, gene):
the same cell is masked alike in any batch or split (st3 drew ``torch.rand_like`` per batch, so
its masks differ for the same seed; the ratio is the same). Precision defaults to fp32: st3's
imputation runs without autocast. One process, unsharded. A result that exists is refused
before sampling unless ``--overwrite``, which first removes every file of the old result.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anndata
import numpy as np
import scipy.sparse as sp
import torch

from sedd.checkpoints import LoadedModel
from sedd.commands.args import add_progress_argument
from sedd.commands.output import check_h5ad_name, request_from_args
from sedd.commands.st3_flags import add_st3_flags, flags_for
from sedd.commands.st3_outputs import OVERWRITE, write_result
from sedd.commands.st3_scripts import _load, _parse, own_arguments
from sedd.defaults import MAX_SEED, PREDICTORS
from sedd.diffusion.randomness import Purpose, cell_uniforms
from sedd.io.files import refuse_existing, write_bytes_atomic
from sedd.io.read import read_counts, read_h5ad_safely
from sedd.io.write import write_h5ad_atomic
from sedd.request.imputation import (
    Imputation,
    dropped_genes_warning,
    imputation_conditions,
    imputation_from_counts,
)

RESULTS_DIR = "imputation_results"
CELLS_FILE = "imputed_cells.h5ad"
WITHIN_BINS = (1, 3, 5, 10)  # st3's within_{k}.csv
# every file of a result, st3's plots included: all are refused, or removed by --overwrite
RESULT_PATTERNS = (
    CELLS_FILE, "accuracy.txt", "mae.json", "metrics.json", "within_*.csv", "cell_*_acc.txt",
    "cell_*_mae.json", "imputation_scatter_hist.png", "single_cell_*.png",
)  # fmt: skip
# The mask's draws: an absorbing-graph model (the only kind that imputes) never draws START
# uniforms, so these are independent of every draw of the sampling.
MASK_PURPOSE = Purpose.START

# (dest, holds, rule, what it is): checked before the model loads
_RULES: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    ("mask_ratio", lambda v: math.isfinite(v) and 0 < v <= 1, "in (0, 1]",
     "the fraction of the cells' entries hidden and imputed, e.g. 0.2 (st3's default)"),
    ("val_fraction", lambda v: math.isfinite(v) and 0 <= v <= 1, "in [0, 1]",
     "the held-out fraction of --data_path's cells, e.g. 0.1 (st3's default)"),
    ("num_steps", lambda v: v >= 1, ">= 1", "reverse diffusion steps, e.g. 50 (st3's default)"),
    ("temperature", lambda v: math.isfinite(v) and v > 0, "finite and > 0", "e.g. 1.0"),
    ("batch_size", lambda v: v >= 1, ">= 1", "cells a batch, e.g. 32 (st3's default)"),
    ("num_batches", lambda v: v is None or v >= 1, ">= 1", "leave it out to impute every batch"),
    ("num_cells_visualize", lambda v: v >= 0, ">= 0", "cells with their own score files"),
    ("seed", lambda v: 0 <= v <= MAX_SEED, "in [0, 2**63 - 1]", "e.g. 42 (st3's default)"),
    ("sampler", lambda v: v in PREDICTORS, f"one of {', '.join(PREDICTORS)}", "st3's is euler"),
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Hide a fraction of real cells' counts, impute them and score the "
        "imputation (st3 inference_imputation).",
        allow_abbrev=False,
    )
    add_st3_flags(p, "imputation")
    own = own_arguments(
        p, precision="fp32", precision_help="default fp32: st3's imputation runs without autocast",
        genes_help="gene names file (default for an st3 model: --data_path's)",
    )  # fmt: skip
    own.add_argument("--output_dir", type=Path,
                     help=f"where results go (default <experiment_dir>/{RESULTS_DIR})")  # fmt: skip
    own.add_argument("--clip", action="store_true", help="clip counts above the model's range")
    which = own.add_mutually_exclusive_group()
    which.add_argument("--condition", help="conditional models: impute every cell under it")
    which.add_argument("--condition_key", metavar="COLUMN",
                       help="conditional models: obs column of each cell's own condition "
                       "(default: the model's training key where the data has it)")  # fmt: skip
    add_progress_argument(own)
    return p


def _named(args: argparse.Namespace, dest: str) -> str:
    """The flag, and the YAML key it came from when ``--config`` set it."""
    if dest not in args.from_yaml:
        return f"--{dest}"
    [row] = [f for f in flags_for("imputation") if f.dest == dest]
    section, key = row.yaml[0]
    return f"--{dest} ({section}.{key} in --config {args.config})"


def check_args(args: argparse.Namespace) -> None:
    """Every value a user can get wrong, in one line naming the flag, before the model loads."""
    for dest, holds, rule, what in _RULES:
        value = getattr(args, dest)
        if not holds(value):
            raise ValueError(f"{_named(args, dest)} must be {rule}, got {value}: {what}.")
    if args.data_path is None:
        raise ValueError("--data_path is not set: pass the .h5ad of real cells to mask and "
                         "impute (or set data.data_path in --config).")  # fmt: skip
    if not Path(args.data_path).is_file():
        raise FileNotFoundError(f"{_named(args, 'data_path')} {args.data_path}: file not found; "
                                "pass the .h5ad of real cells to mask and impute.")  # fmt: skip


def st3_rows(n_cells: int, args: argparse.Namespace) -> np.ndarray:
    """The rows of ``--data_path`` st3 imputes, in its order: ``train_val_split``'s seeded
    permutation, held-out part last; then the first ``--num_batches`` batches of them."""
    order = torch.randperm(n_cells, generator=torch.Generator().manual_seed(args.seed)).numpy()
    held_out = int(n_cells * args.val_fraction)
    rows = order[: n_cells - held_out] if args.use_train_split else order[n_cells - held_out :]
    if args.num_batches is not None:
        rows = rows[: args.num_batches * args.batch_size]
    if len(rows) == 0:
        split = "--use_train_split" if args.use_train_split else "--val_fraction"
        raise ValueError(
            f"{split}: no cell to impute: the split of --data_path's {n_cells} cells at "
            f"--val_fraction {args.val_fraction} leaves {len(rows)} (st3 holds out "
            f"int({n_cells} * {args.val_fraction}) = {held_out}); raise --val_fraction, pass "
            "--use_train_split, or pass more cells."
        )
    return rows


def entry_mask(seed: int, data_rows: np.ndarray, num_genes: int, ratio: float) -> torch.Tensor:
    """(N, G) bool: entry (i, g) is hidden when the uniform of (``seed``, the cell's row in the
    data, gene g) is below ``ratio``; a cell's mask depends on nothing else."""
    n = len(data_rows)
    uniforms = cell_uniforms(  # (N, G) fp64
        torch.full((n,), seed, dtype=torch.int64), torch.as_tensor(data_rows, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64), num_genes, MASK_PURPOSE,
    )  # fmt: skip
    return uniforms < ratio


def masked_imputation(
    loaded: LoadedModel, cells: anndata.AnnData, rows: np.ndarray, args: argparse.Namespace
) -> tuple[Imputation, torch.Tensor, torch.Tensor]:
    """(the imputation request's input, the real tokens (N, G), the hidden entries (N, G)).

    Genes are matched by name; a model gene the data lacks is imputed too but never scored
    (there is no real count to score it against); its real count reads 0."""
    given = imputation_from_counts(
        loaded, [str(g) for g in cells.var_names], cells.X, clip=args.clip, obs=cells.obs.copy(),
        source="the {n} genes of --data_path (var_names)",
    )  # fmt: skip
    dropped_genes_warning(given)
    real = torch.where(given.fixed, given.x_init, 0)  # (N, G)
    hidden = entry_mask(args.seed, rows, loaded.config.num_genes, args.mask_ratio) & given.fixed
    mask_token = loaded.config.tokens.mask_index
    x_init = torch.where(hidden, mask_token, given.x_init)
    return replace(given, x_init=x_init, fixed=given.fixed & ~hidden), real, hidden


def st3_scores(real: torch.Tensor, imputed: torch.Tensor, hidden: torch.Tensor) -> dict[str, Any]:
    """st3's metrics over the hidden entries, taken row by row as st3 concatenates them, and
    averaged as it does (float32 means)."""
    original, predicted = real[hidden], imputed[hidden]  # (M,)
    error = (original - predicted).abs()
    return {
        "accuracy": (original == predicted).float().mean().item(),
        "mae_bins": error.float().mean().item(),
        "within_k": {k: (error <= k).float().mean().item() for k in WITHIN_BINS},
        "num_masked_positions": int(original.numel()),
    }


def cell_scores(real: np.ndarray, imputed: np.ndarray, hidden: np.ndarray) -> tuple[float, float]:
    """(accuracy, mae) of one cell's hidden entries, NaN when none is hidden (st3's numpy)."""
    if not hidden.any():
        return math.nan, math.nan
    original, predicted = real[hidden], imputed[hidden]
    return float((original == predicted).mean()), float(np.abs(original - predicted).mean())


def _write_text(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_st3_files(out_dir: Path, scores: dict[str, Any], cells: list[tuple[float, float]],
                    args: argparse.Namespace, checkpoint: str) -> dict[str, Any]:  # fmt: skip
    """st3's files, byte for byte as st3 formats them; returns metrics.json's content."""
    _write_text(out_dir / "accuracy.txt", f"{scores['accuracy']:.6f}\n")
    _write_text(out_dir / "mae.json", f'{{"mae_bins": {scores["mae_bins"]:.6f}}}\n')
    for k, value in scores["within_k"].items():
        _write_text(out_dir / f"within_{k}.csv", f"within_{k},{value:.6f}\n")
    metrics = {
        "accuracy": scores["accuracy"], "mae_bins": scores["mae_bins"],
        "within_k": scores["within_k"], "mask_ratio": args.mask_ratio,
        "num_steps": args.num_steps, "temperature": args.temperature,
        "num_masked_positions": scores["num_masked_positions"], "checkpoint": checkpoint,
    }  # fmt: skip
    _write_text(out_dir / "metrics.json", json.dumps(metrics, indent=2))  # st3: no last newline
    for i, (accuracy, mae) in enumerate(cells):
        _write_text(out_dir / f"cell_{i}_acc.txt", f"{accuracy:.6f}\n")
        _write_text(out_dir / f"cell_{i}_mae.json", f'{{"mae_bins": {mae:.6f}}}\n')
    return metrics


def _existing_results(out_dir: Path) -> list[Path]:
    return sorted({path for pattern in RESULT_PATTERNS for path in out_dir.glob(pattern)})


def _refuse_existing_result(out_dir: Path, args: argparse.Namespace) -> None:
    for path in _existing_results(out_dir):
        refuse_existing(path, overwrite=args.overwrite, flag=OVERWRITE)


def _dense(x: Any) -> np.ndarray:
    return np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.int64)


def _add_to_cells(out: Path, real: torch.Tensor, hidden: torch.Tensor, rows: np.ndarray,
                  record: dict[str, Any]) -> None:  # fmt: skip
    """The written cells, with what scores them: the real counts, the mask, the data rows."""
    adata = read_h5ad_safely(out, what="the result")
    adata.layers["real_counts"] = sp.csr_matrix(real.numpy().astype(np.int32))
    adata.layers["imputation_mask"] = sp.csr_matrix(hidden.numpy().astype(np.int8))
    adata.obs["data_row"] = rows.astype(np.int64)
    adata.uns["st3_imputation"] = record
    write_h5ad_atomic(adata, out)


def _load_named(args: argparse.Namespace) -> LoadedModel:
    """The model; an st3 model without gene names takes ``--data_path``'s (st3's columns are the
    model's genes), unless ``--genes`` names them: then the warning that its genes are
    positional, which would be wrong here, is not shown."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = _load(args)
    if loaded.config.genes_by_position and args.genes is None:
        return _load(args, genes=args.data_path)
    for warning in caught:
        warnings.warn(warning.message, stacklevel=2)
    return loaded


def inference_imputation(argv: Sequence[str] | None = None) -> int:
    args = _parse(_parser(), "imputation", argv)
    check_args(args)
    out_dir = args.output_dir or Path(args.experiment_dir) / RESULTS_DIR
    out = out_dir / CELLS_FILE
    check_h5ad_name(out, "--output_dir")
    _refuse_existing_result(out_dir, args)
    checkpoint = args.checkpoint  # st3 records it as given (or the file it found)
    data = read_counts(args.data_path, what="--data_path")
    rows = st3_rows(data.n_obs, args)  # an empty split is refused before the model loads
    cells = data[rows]
    loaded = _load_named(args)
    checkpoint = checkpoint or str(loaded.weights_file or loaded.path)
    imputation, real, hidden = masked_imputation(loaded, cells, rows, args)
    conditions, counts = imputation_conditions(
        loaded, imputation, args.condition, args.condition_key
    )
    args.steps, args.time_grid, args.cell_type = args.num_steps, "uniform", None
    args.num_shards, args.shard_index = 1, 0  # one process (never a SLURM array's shard)
    request = request_from_args(
        args, cells_per_condition=imputation.num_cells if counts is None else 1,
        conditions=conditions, imputation=imputation, condition_counts=counts,
    )  # fmt: skip
    split = "train" if args.use_train_split else "val"
    extra = {"data_path": str(args.data_path), "split": split,
             "masked_positions": int(hidden.sum())}  # fmt: skip
    if args.overwrite:  # the old result goes before the new one is sampled
        for path in _existing_results(out_dir):
            path.unlink()
    write_result(loaded, request, args, out, "inference_imputation", extra)
    written = read_h5ad_safely(out, what="the result")
    if list(written.obs_names) != list(cells.obs_names):  # a bug, not a user error
        raise RuntimeError(f"{out}: the imputed cells are not --data_path's, in order.")
    imputed = torch.from_numpy(_dense(written.X))
    scores = st3_scores(real, imputed, hidden)
    shown = min(args.num_cells_visualize, len(rows))
    per_cell = [cell_scores(real[i].numpy(), imputed[i].numpy(), hidden[i].numpy())
                for i in range(shown)]  # fmt: skip
    metrics = write_st3_files(out_dir, scores, per_cell, args, checkpoint)
    within_k = {str(k): v for k, v in scores["within_k"].items()}  # h5ad keys are text
    record = {**metrics, "within_k": within_k, "data_path": str(args.data_path), "split": split}
    _add_to_cells(out, real, hidden, rows, record)
    within = ", ".join(f"{k}: {v:.2%}" for k, v in scores["within_k"].items())
    print(
        f"imputed {scores['num_masked_positions']} hidden entries of {len(rows)} cells ({split} "
        f"split of --data_path): exact match {scores['accuracy']:.2%}, MAE "
        f"{scores['mae_bins']:.2f} bins, within k bins {within}"
    )
    print(f"results in {out_dir} (st3's files; the cells: {CELLS_FILE}); st3's plots are not drawn")
    return 0
