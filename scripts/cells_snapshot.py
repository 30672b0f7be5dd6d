"""Cells of many sampling configurations, written to one .npz, and two such files compared: how a
change to the sampler shows whether it changed any cell.

    python scripts/cells_snapshot.py write OUT.npz     # with the sedd on PYTHONPATH
    python scripts/cells_snapshot.py compare A.npz B.npz

To compare with an earlier commit: ``git worktree add /tmp/prev COMMIT``, then ``write`` once with
``PYTHONPATH=/tmp/prev`` (run from /tmp/prev) and once from this checkout. It takes about 12
minutes with one thread on a 2-core CPU (bf16 is emulated or slow on most CPUs).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import anndata
import numpy as np
import torch

ROOT = Path.cwd()


def dense(adata: anndata.AnnData) -> np.ndarray:
    return np.asarray(adata.X.todense()) if hasattr(adata.X, "todense") else np.asarray(adata.X)


def snapshot() -> dict[str, np.ndarray]:
    """The bundled model (fp32 and bf16: Euler and analytic, temperature 1 and 0.7, 10 and 50
    steps, imputation) and the two reference SEDD models (uniform and absorbing graphs)."""
    import sedd

    cells: dict[str, np.ndarray] = {}
    real = anndata.read_h5ad(ROOT / "data/pbmc68k_counts.h5ad")[:20].copy()
    real.X = real.X.astype(np.float32)
    for precision in ("fp32", "bf16"):
        model = sedd.load(precision=precision, device="cpu")
        for sampler in ("euler", "analytic"):
            for temperature in (1.0, 0.7):
                made = model.generate(num_cells=12, steps=10, sampler=sampler,
                                      temperature=temperature, seed=3, progress=False)  # fmt: skip
                cells[f"{precision}-{sampler}-{temperature}"] = dense(made)
        cells[f"{precision}-50"] = dense(model.generate(num_cells=8, steps=50, seed=5,
                                                        progress=False))  # fmt: skip
        made = model.impute(real, condition_key="bulk_labels", seed=2, steps=10, progress=False)
        cells[f"{precision}-impute"] = dense(made)
    for graph in ("uniform", "absorb"):
        path = ROOT / f"tests/data/sedd_reference/{graph}/hf"
        model = sedd.load(path, precision="fp32", device="cpu")
        cells[f"reference-{graph}"] = dense(model.generate(num_cells=8, steps=20, seed=1,
                                                           progress=False))  # fmt: skip
    return cells


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> int:
    """Print, per configuration, the cells and counts that differ; 1 if any do."""
    total_cells = total_counts = changed_cells = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b or a[name].shape != b[name].shape:
            print(f"{name}: only in one file, or shapes differ")
            return 1
        differ = a[name] != b[name]
        cells = int(differ.any(axis=1).sum())
        print(f"{name}: {cells} of {len(differ)} cells differ, {int(differ.sum())} counts")
        total_cells += len(differ)
        changed_cells += cells
        total_counts += int(differ.sum())
    print(f"all: {changed_cells} of {total_cells} cells differ, {total_counts} counts")
    return int(changed_cells > 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("out", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("a", type=Path)
    both.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "write":
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore")
        np.savez(args.out, **snapshot())
        return 0
    return compare(dict(np.load(args.a)), dict(np.load(args.b)))


if __name__ == "__main__":
    sys.exit(main())
