"""Quality against model forwards on the bundled model: steps, time grids and predictors.

Each setting (predictor, grid, steps) generates the held-out split's label composition (105
cells) for several seeds; every set is scored with the project's quality figures
(``sedd.eval.quality``) against the held-out cells. A setting is "within seed noise" of 50
uniform Euler steps when no figure's mean over seeds is worse than that setting's by more than
twice the standard error of the difference.

Generation is resumable and can be split over processes (each writes its own sets file):

    OMP_NUM_THREADS=1 python scripts/quality_vs_steps.py run --part 0/2 &
    OMP_NUM_THREADS=1 python scripts/quality_vs_steps.py run --part 1/2
    python scripts/quality_vs_steps.py report  # table, JSON, docs/quality_vs_forwards.png

``oracle`` does the same on an exactly known distribution (``sedd.eval.exact``: a Potts chain of
10 binary positions with strong coupling): the total variation between the sampler's cells and
the exact law against steps, next to the TV of as many exact draws (the sampling-noise floor).

    OMP_NUM_THREADS=1 python scripts/quality_vs_steps.py oracle  # table, docs/oracle_tv.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench_results" / "quality_vs_steps"
PNG = ROOT / "docs" / "quality_vs_forwards.png"
BASELINE = ("euler", "uniform", 50)

# (predictor, grid, steps, seeds): the default, the reference and the 5-step settings at 10 seeds,
# the settings near them at 5; 100 and 200 steps at fewer, since they only show the curve's shape.
PLAN = [
    *(("euler", "uniform", n, 10) for n in (10, 50)),  # the default and the reference
    *(("euler", "uniform", n, 5) for n in (15, 20, 35)),
    *(("euler", "cosine", n, 5) for n in (10, 15, 20)),
    ("euler", "uniform", 5, 10),  # cheap, and the fewest forwards: as many seeds as the default
    ("euler", "cosine", 5, 10),
    ("euler", "uniform", 100, 3),
    ("euler", "uniform", 200, 2),
    *(("analytic", "uniform", n, 3) for n in (15, 20)),
]


def _name(predictor: str, grid: str, steps: int, seed: int) -> str:
    return f"{predictor}-{grid}-{steps}-s{seed}"


def _items() -> list[tuple[str, str, int, int]]:
    return [(p, g, n, seed) for p, g, n, seeds in PLAN for seed in range(seeds)]


def run(part: int, parts: int, precision: str, tokens_per_forward: int) -> None:
    from sedd.api import load
    from sedd.defaults import BUNDLED_DATA
    from sedd.engine.forwards import block_rows_for
    from sedd.eval.quality import HeldOut

    model = load(device="cpu", precision=precision, tokens_per_forward=tokens_per_forward)
    held_out = HeldOut.from_file(BUNDLED_DATA, model.genes)
    labels = held_out.test_labels
    OUT.mkdir(parents=True, exist_ok=True)
    store = OUT / f"sets-{part}.npz"
    sets = dict(np.load(store)) if store.exists() else {}
    done = set(_load_sets())  # whichever part made a set, it is not made again
    todo = [item for item in _items() if _name(*item) not in done]
    mine = [item for i, item in enumerate(todo) if i % parts == part]
    for predictor, grid, steps, seed in mine:
        name = _name(predictor, grid, steps, seed)
        start = time.perf_counter()
        adata = model.generate(
            1, condition=labels, steps=steps, time_grid=grid, sampler=predictor, seed=seed,
            batch_size=128,
        )  # fmt: skip
        sets[name] = np.asarray(adata.X.toarray(), dtype=np.int32)
        # model calls over the set; each call is one block of block_rows cells
        calls = int(adata.uns["sedd"]["timings"]["forwards"])
        blocks = -(-len(labels) // block_rows_for(len(model.genes), "cpu", tokens_per_forward))
        forwards = calls / blocks  # forwards each cell went through
        sets[f"{name}/forwards"] = np.asarray(forwards)
        np.savez_compressed(store, **sets)
        seconds = time.perf_counter() - start
        print(f"{name}: {forwards:.2f} forwards a cell, {seconds:.0f} s", flush=True)


def _load_sets() -> dict[str, np.ndarray]:
    sets: dict[str, np.ndarray] = {}
    for store in sorted(OUT.glob("sets-*.npz")):
        sets.update(dict(np.load(store)))
    return sets


def report() -> None:
    from sedd.api import load
    from sedd.defaults import BUNDLED_DATA
    from sedd.eval.quality import FIGURES, HeldOut

    model = load(device="cpu", precision="fp32")
    held_out = HeldOut.from_file(BUNDLED_DATA, model.genes)
    sets = _load_sets()
    rows = []
    for predictor, grid, steps, _ in PLAN:
        names = [
            _name(predictor, grid, steps, seed)
            for seed in range(max(seeds for *_, seeds in PLAN))
            if _name(predictor, grid, steps, seed) in sets
        ]
        if not names:
            continue
        scores = [held_out.figures(sets[n], held_out.test_labels) for n in names]
        # all seeds' cells together: a less noisy view of the within-label structure, which reads
        # higher the more seeds it pools (so its cells are recorded beside it)
        pooled = held_out.within_label_agreement(
            np.concatenate([sets[n] for n in names]), held_out.test_labels * len(names)
        )
        rows.append(
            {
                "predictor": predictor,
                "grid": grid,
                "steps": steps,
                "forwards": float(np.mean([float(sets[f"{n}/forwards"]) for n in names])),
                "seeds": len(names),
                "mean": {f: float(np.mean([s[f] for s in scores])) for f in FIGURES},
                "sd": {f: float(np.std([s[f] for s in scores], ddof=1)) for f in FIGURES},
                "pooled_within_label_agreement": pooled,
                "pooled_cells": len(names) * len(held_out.test_labels),
            }
        )
    base = next(r for r in rows if (r["predictor"], r["grid"], r["steps"]) == BASELINE)
    for row in rows:
        row["within_noise"] = _within_noise(row, base, FIGURES)
    _print_table(rows, FIGURES)
    (OUT / "summary.json").write_text(json.dumps(rows, indent=2))
    _plot(rows, FIGURES)
    print(f"wrote {OUT / 'summary.json'} and {PNG}")


# the direction in which each figure gets worse
_WORSE = {"corr_rms": 1, "mmd2_rbf": 1, "energy_distance": 1, "within_label_agreement": -1}


def _within_noise(row: dict, base: dict, figures: tuple[str, ...]) -> bool:
    """No figure worse than the baseline's by more than 2 standard errors of the difference
    (one-sided: a setting that scores better is not penalised for it)."""
    if row["seeds"] < 2:
        return False
    for f in figures:
        se = np.sqrt(row["sd"][f] ** 2 / row["seeds"] + base["sd"][f] ** 2 / base["seeds"])
        if _WORSE[f] * (row["mean"][f] - base["mean"][f]) > 2 * se:
            return False
    return True


def _print_table(rows: list[dict], figures: tuple[str, ...]) -> None:
    head = "| predictor | grid | steps | forwards | seeds | " + " | ".join(figures)
    print(head + " | pooled agreement (cells) | within noise of 50 uniform |")
    print("|" + "---|" * (7 + len(figures)))
    for r in sorted(rows, key=lambda r: (r["forwards"], r["grid"], r["predictor"])):
        cells = " | ".join(f"{r['mean'][f]:.4f} ± {r['sd'][f]:.4f}" for f in figures)
        print(
            f"| {r['predictor']} | {r['grid']} | {r['steps']} | {r['forwards']:.1f} | {r['seeds']} "
            f"| {cells} | {r['pooled_within_label_agreement']:.3f} ({r['pooled_cells']}) "
            f"| {'yes' if r['within_noise'] else 'no'} |"
        )


def _plot(rows: list[dict], figures: tuple[str, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(figures), figsize=(4.2 * len(figures), 3.6))
    series = sorted({(r["predictor"], r["grid"]) for r in rows})
    for ax, f in zip(axes, figures, strict=True):
        for predictor, grid in series:
            pts = sorted(
                (r for r in rows if (r["predictor"], r["grid"]) == (predictor, grid)),
                key=lambda r: r["forwards"],
            )
            ax.errorbar(
                [r["forwards"] for r in pts],
                [r["mean"][f] for r in pts],
                yerr=[r["sd"][f] for r in pts],
                marker="o",
                capsize=3,
                label=f"{predictor}, {grid}",
            )
        ax.set_xscale("log")
        ax.set_xlabel("model forwards per cell")
        ax.set_title(f)
    axes[0].legend(fontsize=8)
    fig.suptitle("bundled PBMC model: quality against forwards (mean ± sd over seeds)")
    fig.tight_layout()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG, dpi=110)


ORACLE_STEPS = (1, 2, 4, 8, 16, 32, 64, 128)
ORACLE_SETTINGS = (("euler", "uniform"), ("euler", "cosine"), ("analytic", "uniform"))


def oracle(positions: int, tokens: int, coupling: float, cells: int) -> None:
    import torch

    from sedd.diffusion.graph import AbsorbingGraph
    from sedd.diffusion.noise import LogLinearNoise
    from sedd.diffusion.st3_samplers import AnalyticSampler, EulerSampler
    from sedd.eval.exact import ExactModel, potts_distribution, state_index

    joint = potts_distribution(positions, tokens, coupling)
    model = ExactModel(joint, positions, tokens, "x0")
    noise, graph = LogLinearNoise(), AbsorbingGraph(tokens)

    def tv(tokens_drawn: torch.Tensor) -> float:
        counts = torch.bincount(state_index(tokens_drawn, tokens), minlength=len(joint))
        return 0.5 * float((counts.double() / len(tokens_drawn) - joint).abs().sum())

    gen = torch.Generator().manual_seed(0)
    floor = [
        0.5 * float((torch.bincount(torch.multinomial(joint, cells, True, generator=gen),
                                    minlength=len(joint)).double() / cells - joint).abs().sum())
        for _ in range(3)
    ]  # fmt: skip
    rows = []
    for predictor, grid in ORACLE_SETTINGS:
        cls = AnalyticSampler if predictor == "analytic" else EulerSampler
        sampler = cls(model, noise, graph, use_amp=False)
        for steps in ORACLE_STEPS:
            drawn = sampler.sample(
                cells, steps=steps, num_genes=positions, time_grid=grid,  # type: ignore[arg-type]
                seed=steps,
            )  # fmt: skip
            rows.append({"predictor": predictor, "grid": grid, "steps": steps, "tv": tv(drawn)})
            print(f"{predictor} {grid} {steps} steps: TV {rows[-1]['tv']:.4f}", flush=True)
    result = {
        "positions": positions, "tokens": tokens, "coupling": coupling, "cells": cells,
        "tv_floor_exact_draws": float(np.mean(floor)), "rows": rows,
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "oracle.json").write_text(json.dumps(result, indent=2))
    print(f"\nTV floor ({cells} exact draws): {result['tv_floor_exact_draws']:.4f}")
    print("| steps | " + " | ".join(f"{p}, {g}" for p, g in ORACLE_SETTINGS) + " |")
    print("|---|" + "---|" * len(ORACLE_SETTINGS))
    for steps in ORACLE_STEPS:
        tvs = [r["tv"] for r in rows if r["steps"] == steps]
        print(f"| {steps} | " + " | ".join(f"{v:.4f}" for v in tvs) + " |")
    _plot_oracle(result)


def _plot_oracle(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for predictor, grid in ORACLE_SETTINGS:
        pts = [r for r in result["rows"] if (r["predictor"], r["grid"]) == (predictor, grid)]
        ax.plot([r["steps"] + 1 for r in pts], [r["tv"] for r in pts], marker="o",
                label=f"{predictor}, {grid}")  # fmt: skip
    ax.axhline(result["tv_floor_exact_draws"], color="grey", ls="--", label="exact draws (floor)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model forwards per cell (steps + denoise)")
    ax.set_ylabel("total variation to the exact law")
    ax.set_title(
        f"Potts chain, {result['positions']} positions x {result['tokens']} tokens, "
        f"{result['cells']} cells",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "oracle_tv.png", dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="generate the sets (resumable)")
    r.add_argument("--part", default="0/1", help="K/N: run every N-th setting from the K-th")
    r.add_argument("--precision", default="auto")
    r.add_argument("--tokens-per-forward", type=int, default=4 * 765)
    sub.add_parser("report", help="score the sets: table, JSON and PNG")
    o = sub.add_parser("oracle", help="TV against steps on an exactly known distribution")
    o.add_argument("--positions", type=int, default=10)
    o.add_argument("--tokens", type=int, default=2)
    o.add_argument("--coupling", type=float, default=2.0)
    o.add_argument("--cells", type=int, default=200_000)
    args = p.parse_args()
    if args.command == "oracle":
        oracle(args.positions, args.tokens, args.coupling, args.cells)
    elif args.command == "run":
        part, parts = (int(v) for v in args.part.split("/"))
        run(part, parts, args.precision, args.tokens_per_forward)
    else:
        report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
