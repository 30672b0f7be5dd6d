"""Cells on CUDA against cells on the CPU: one request, one seed, fp32, cell for cell.

    python scripts/gpu_compare_cells.py --out bench_results/gpu_check/compare_cells.json
    python scripts/gpu_compare_cells.py --arms cpu cuda:1 cuda:1+graphs --num-conditions 2 ...

Each arm loads the model with ``sedd.load(device=..., precision="fp32", cuda_graphs=...)`` and
generates the same request (``Model.generate``: cells per condition, steps, seed) on the same
row block (``tokens_per_forward`` = rows x genes, equal in every arm, so only the device
differs). An arm is a device, with ``+graphs`` for CUDA graphs (default: ``cpu cuda
cuda+graphs``). The first arm is the reference; every other arm is compared with it, and each
``+graphs`` arm also with its eager twin. The JSON (``--out``) holds the request, each arm's
wall time and, per comparison, ``identical`` or else the first differing cell (index, name,
condition), its first differing gene (index, name) and both counts, and how many cells and
values differ.

Exit status: 1 if a graphs arm differs from its eager twin (graphs must never change a cell)
or replayed no graph (its capture failed and it ran eager), or, with ``--require-identical``
(the emulated lane, where the CUDA device computes on this CPU), if any comparison differs; 0
otherwise. On a real GPU CUDA's fp32 kernels may round
differently from the CPU's, and a draw that lands on a boundary then differs: the report shows
where, it does not fail the check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np


def parse_arm(text: str) -> tuple[str, bool]:
    """``cuda+graphs`` -> ("cuda", True); ``cpu`` -> ("cpu", False)."""
    device, _, extra = text.partition("+")
    if extra not in ("", "graphs") or not device:
        raise argparse.ArgumentTypeError(f"an arm is DEVICE or DEVICE+graphs, got {text!r}")
    return device, extra == "graphs"


def compare_counts(
    a: np.ndarray,
    b: np.ndarray,
    genes: list[str],
    cells: list[str] | None = None,
    conditions: list[str] | None = None,
) -> dict[str, object]:
    """``{"identical": True}``, or where (cells x genes) count matrices ``a`` and ``b`` first
    differ: the first differing cell (row order) and, in it, the first differing gene."""
    if a.shape != b.shape:
        return {"identical": False, "shape_a": list(a.shape), "shape_b": list(b.shape)}
    differs = a != b
    if not differs.any():
        return {"identical": True}
    cell = int(np.flatnonzero(differs.any(axis=1))[0])
    gene = int(np.flatnonzero(differs[cell])[0])
    out: dict[str, object] = {
        "identical": False,
        "first_cell": cell,
        "first_gene_index": gene,
        "first_gene": genes[gene],
        "count_a": int(a[cell, gene]),
        "count_b": int(b[cell, gene]),
        "cells_differing": int(differs.any(axis=1).sum()),
        "values_differing": int(differs.sum()),
        "cells": int(a.shape[0]),
    }
    if cells is not None:
        out["first_cell_name"] = cells[cell]
    if conditions is not None:
        out["first_cell_condition"] = conditions[cell]
    return out


def run_arm(
    device: str,
    graphs: bool,
    *,
    model: str | None,
    cells: int,
    conditions: list[str] | None,
    num_conditions: int | None,
    steps: int | None,
    seed: int,
    rows_per_forward: int,
) -> dict[str, object]:
    """One arm's cells: counts (cells x genes), gene and cell names, conditions, seconds."""
    import sedd

    model_ = sedd.load(model, device=device, precision="fp32", cuda_graphs=graphs)
    loaded = model_.loaded
    model_.tokens_per_forward = rows_per_forward * loaded.config.num_genes
    names = conditions
    if names is None and num_conditions is not None and loaded.conditions:
        names = loaded.conditions[:num_conditions]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        adata = model_.generate(cells, condition=names, steps=steps, seed=seed, progress=False)
        seconds = time.perf_counter() - start
    for w in caught:  # shown as usual, and kept in the JSON (a failed capture warns)
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    counts = adata.X.toarray() if hasattr(adata.X, "toarray") else np.asarray(adata.X)
    labels = [str(c) for c in adata.obs["condition"]] if "condition" in adata.obs else None
    return {
        "counts": counts,
        "genes": [str(g) for g in adata.var_names],
        "cells": [str(c) for c in adata.obs_names],
        "conditions": labels,
        "figures": {
            "device": str(loaded.device),
            "cuda_graphs": graphs,
            "seconds": seconds,
            "cells": int(counts.shape[0]),
            "forwards": int(adata.uns["sedd"]["timings"]["forwards"]),
            **_graph_counts(model_),
            "warnings": sorted({str(w.message).splitlines()[0] for w in caught}),
        },
        "request": {
            "model": str(loaded.path),
            "conditions": list(dict.fromkeys(labels)) if labels else None,
            "cells_per_condition": cells,
            "steps": int(adata.uns["sedd"]["steps"]),
            "seed": seed,
            "precision": "fp32",
            "rows_per_forward": rows_per_forward,
            "tokens_per_forward": model_.tokens_per_forward,
        },
    }


def _graph_counts(model: object) -> dict[str, int]:
    """CUDA graph captures and replays of a ``sedd.Model``'s samplers: a ``+graphs`` arm whose
    replays are 0 ran eager (a failed capture falls back with a warning)."""
    samplers = getattr(model, "_samplers", {}).values()
    graphs = [s.graphs for s in samplers if getattr(s, "graphs", None) is not None]
    return {
        "graph_captures": sum(int(getattr(g, "captures", 0)) for g in graphs),
        "graph_replays": sum(int(getattr(g, "replays", 0)) for g in graphs),
    }


def compare_arms(arms: list[str], **request: object) -> dict[str, object]:
    """Every arm's cells for one request; each arm against the first, graphs against eager."""
    runs = {}
    for arm in arms:
        device, graphs = parse_arm(arm)
        key = arm if arm not in runs else f"{arm}#{len(runs)}"
        print(f"gpu_compare_cells: {key} ...", flush=True)
        runs[key] = run_arm(device, graphs, **request)  # type: ignore[arg-type]
    names = list(runs)
    pairs = [(names[0], other) for other in names[1:]]
    for name in names:
        device, graphs = parse_arm(name.split("#")[0])
        if graphs and device in runs and (device, name) not in pairs:
            pairs.append((device, name))
    comparisons = []
    for a, b in pairs:
        ra, rb = runs[a], runs[b]
        found = compare_counts(
            ra["counts"],
            rb["counts"],
            ra["genes"],
            ra["cells"],  # type: ignore[arg-type]
            ra["conditions"],
        )  # type: ignore[arg-type]
        comparisons.append({"a": a, "b": b, **found})
    first = runs[names[0]]
    figures = {name: run["figures"] for name, run in runs.items()}
    return {
        "request": first["request"],
        "arms": figures,
        "comparisons": comparisons,
        "identical": all(c["identical"] for c in comparisons),
        "graphs_not_replayed": [name for name, f in figures.items() if _graphs_idle(f)],
    }


def _graphs_idle(figures: dict[str, object]) -> bool:
    """A CUDA ``+graphs`` arm that replayed no graph."""
    on_cuda = str(figures["device"]).startswith("cuda")
    return bool(figures["cuda_graphs"]) and on_cuda and not figures["graph_replays"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arms",
        nargs="+",
        default=["cpu", "cuda", "cuda+graphs"],
        help="DEVICE or DEVICE+graphs; the first is the reference",
    )
    p.add_argument("--model", default=None, help="model path (default: the bundled model)")
    p.add_argument("--cells", type=int, default=2, help="cells per condition (default 2)")
    p.add_argument("--conditions", nargs="+", default=None, help="default: every condition")
    p.add_argument(
        "--num-conditions",
        type=int,
        default=None,
        help="the model's first N conditions (instead of --conditions)",
    )
    p.add_argument("--steps", type=int, default=None, help="default: the library's schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rows-per-forward",
        type=int,
        default=16,
        help="rows per forward block, equal in every arm (default 16)",
    )
    p.add_argument(
        "--require-identical",
        action="store_true",
        help="exit 1 if any arm differs from the first (the emulated lane)",
    )
    p.add_argument("--out", type=Path, default=Path("bench_results/compare_cells.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for arm in args.arms:
        parse_arm(arm)
    if len(args.arms) < 2 or args.cells < 1 or args.rows_per_forward < 1:
        raise SystemExit("need two arms or more, --cells >= 1 and --rows-per-forward >= 1")
    result = compare_arms(
        args.arms,
        model=args.model,
        cells=args.cells,
        conditions=args.conditions,
        num_conditions=args.num_conditions,
        steps=args.steps,
        seed=args.seed,
        rows_per_forward=args.rows_per_forward,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for c in result["comparisons"]:  # type: ignore[union-attr]
        where = (
            "identical"
            if c["identical"]
            else (
                f"differ: first at cell {c.get('first_cell')} gene {c.get('first_gene')!r} "
                f"({c.get('count_a')} vs {c.get('count_b')}), {c.get('cells_differing')} of "
                f"{c.get('cells')} cells"
            )
        )
        print(f"{c['a']} vs {c['b']}: {where}")
    print(f"wrote {args.out}")
    graphs_broken = any(
        not c["identical"] and parse_arm(c["b"].split("#")[0]) == (c["a"], True)
        for c in result["comparisons"]  # type: ignore[union-attr]
    )
    for name in result["graphs_not_replayed"]:  # type: ignore[union-attr]
        print(f"{name}: no CUDA graph was replayed (the capture failed: see its warnings)")
    if graphs_broken or result["graphs_not_replayed"]:
        return 1
    if args.require_identical and not result["identical"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
