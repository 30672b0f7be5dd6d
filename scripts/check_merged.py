"""Check a merged ``sedd predict`` h5ad against the request that made it (used by .ci/slurm.sh).

    python scripts/check_merged.py MERGED.h5ad --model DIR --perturbations-file F \
        --cells-per-perturbation N [--same-as OTHER.h5ad]

Checks: var_names are the model's genes in model order; the cell count is N per condition
(the listed perturbations, plus the model's control label unless --no-control); obs has a
``perturbation`` column with exactly N cells per condition; counts are finite non-negative
integers. ``--same-as`` also requires X and obs to equal another merged file's exactly.
Exit status 0 when every check passes, 1 otherwise (each failure is printed).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

from sedd.checkpoints import read_model_config


def _dense(matrix: object) -> np.ndarray:
    return matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)


def expected_conditions(names: list[str], control: str | None, no_control: bool) -> list[str]:
    conditions = list(dict.fromkeys(names))
    if control is not None and not no_control and control not in conditions:
        conditions.append(control)
    return conditions


def check(args: argparse.Namespace) -> list[str]:
    problems: list[str] = []
    adata = anndata.read_h5ad(args.merged)
    config = read_model_config(args.model / "config.json")
    names = [
        line.strip() for line in args.perturbations_file.read_text().splitlines() if line.strip()
    ]
    conditions = expected_conditions(names, config.control_label, args.no_control)
    n = args.cells_per_perturbation

    if list(adata.var_names) != list(config.genes):
        problems.append(
            f"var_names differ from the model's {len(config.genes)} genes "
            f"(first: {list(adata.var_names[:3])} vs {config.genes[:3]})"
        )
    if adata.n_obs != n * len(conditions):
        problems.append(
            f"{adata.n_obs} cells, expected {n} x {len(conditions)} conditions "
            f"{conditions} = {n * len(conditions)}"
        )
    if "condition" not in adata.obs:
        problems.append(f"obs has no 'condition' column: {list(adata.obs.columns)}")
    else:
        counts = Counter(map(str, adata.obs["condition"]))
        wanted = dict.fromkeys(conditions, n)
        if dict(counts) != wanted:
            problems.append(f"cells per perturbation {dict(counts)}, expected {wanted}")
    x = _dense(adata.X)
    if not np.isfinite(x).all() or (x < 0).any() or not np.array_equal(x, np.round(x)):
        problems.append("X holds values that are not finite non-negative integers")

    if args.same_as is not None:
        other = anndata.read_h5ad(args.same_as)
        if not np.array_equal(x, _dense(other.X)):
            diff = int((x != _dense(other.X)).sum()) if x.shape == other.X.shape else -1
            problems.append(f"X differs from {args.same_as} ({diff} entries)")
        try:
            pd.testing.assert_frame_equal(adata.obs, other.obs)
        except AssertionError as err:
            problems.append(f"obs differs from {args.same_as}: {err}")
        if list(adata.obs_names) != list(other.obs_names):
            problems.append(f"obs_names differ from {args.same_as}")
    print(
        f"{args.merged}: {adata.n_obs} cells x {adata.n_vars} genes, conditions "
        f"{dict(Counter(map(str, adata.obs.get('condition', []))))}, "
        f"total counts {int(x.sum())}"
        + (f", identical to {args.same_as}" if args.same_as and not problems else "")
    )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("merged", type=Path, help="merged .h5ad")
    parser.add_argument("--model", type=Path, required=True, help="native model directory")
    parser.add_argument("--perturbations-file", type=Path, required=True)
    parser.add_argument("--cells-per-perturbation", type=int, required=True)
    parser.add_argument("--no-control", action="store_true", help="no control cells expected")
    parser.add_argument("--same-as", type=Path, help="require identical X and obs")
    problems = check(parser.parse_args())
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print("merged file OK" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
