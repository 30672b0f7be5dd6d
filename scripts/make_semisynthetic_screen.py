"""Build a SEMI-SYNTHETIC Perturb-seq-like screen with planted truth from the bundled real PBMC
counts (issue 47, item 5), to test ``sedd evaluate --perturbation`` on a known answer.

The real cells (all, or one label's with --base-label) are cut in two disjoint halves; the screen's
cells are dealt out to a control group ("non-targeting") and to synthetic perturbations
``SYN-P01``..; each perturbation scales its own planted genes by planted factors (binomial
thinning down, Poisson addition up: ``sedd.eval.planted_screen``). Everything else is real.

Writes, all labelled semi-synthetic (``uns["semi_synthetic"]``, ``uns["description"]``,
``uns["planted_truth"]``, ``uns["scale"] = "counts"``):

* ``--out``: the screen; obs ``perturbation``, ``split`` (``test`` for the held-out
  perturbations and half the control cells), ``source_cell``;
* ``--split-json``: the held-out perturbations as scLDM writes them, ``{"cell_type", "pert"}``;
* ``--redraw``: a fresh draw of the same plan from the other half of the real cells, a stand-in
  "generated" file that a perfect model would produce.

    python scripts/make_semisynthetic_screen.py --out /tmp/screen.h5ad \\
        --split-json /tmp/screen_split.json --redraw /tmp/screen_redraw.h5ad
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sedd.defaults import BUNDLED_DATA
from sedd.eval.planted_screen import (
    CONTROL_LABEL,
    ScreenDraw,
    draw_screen,
    plan_effects,
    planted_truth_uns,
    split_pool,
)
from sedd.io.read import read_counts
from sedd.io.write import write_cells_h5ad


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=BUNDLED_DATA, help="real counts, .h5ad")
    p.add_argument("--out", type=Path, required=True, help="the screen, .h5ad")
    p.add_argument("--split-json", type=Path, default=None, help="scLDM-style held-out JSON")
    p.add_argument("--redraw", type=Path, default=None, help="a fresh draw of the same plan")
    p.add_argument("--label-key", default="bulk_labels", help="obs column of the source labels")
    p.add_argument("--base-label", default="all", help="source label to use, or 'all'")
    p.add_argument("--n-perturbations", type=int, default=6)
    p.add_argument("--genes-per-perturbation", type=int, default=10)
    p.add_argument("--cells-per-perturbation", type=int, default=35)
    p.add_argument("--n-control", type=int, default=100)
    p.add_argument("--held-out", type=int, default=3, help="perturbations in the test split")
    p.add_argument("--plan-seed", type=int, default=0, help="which genes and factors")
    p.add_argument("--seed", type=int, default=1, help="which cells and thinning (--redraw: +1)")
    return p.parse_args()


def write_screen(
    path: Path,
    draw: ScreenDraw,
    genes: list[str],
    source_names: np.ndarray,
    held_out: list[str],
    uns: dict[str, object],
) -> None:
    """The screen as .h5ad: counts, perturbation, split, the real cell each row came from."""
    is_control = draw.labels == CONTROL_LABEL
    test = np.isin(draw.labels, held_out)
    control_rows = np.flatnonzero(is_control)
    test[control_rows[: len(control_rows) // 2]] = True  # half the control cells are held out
    obs = pd.DataFrame(
        {
            "perturbation": draw.labels.astype(str),
            "split": np.where(test, "test", "train"),
            "source_cell": source_names[draw.source_rows].astype(str),
        },
        index=[f"semisynthetic-{i}" for i in range(len(draw.labels))],
    )
    write_cells_h5ad(path, draw.counts, genes, obs, uns)


def main() -> None:
    args = parse_args()
    source = read_counts(args.source)
    if args.base_label != "all":
        source = source[(source.obs[args.label_key].astype(str) == args.base_label).to_numpy()]
        if source.n_obs == 0:
            raise ValueError(f"--base-label {args.base_label!r} matches no cell of {args.source}.")
    pool = np.asarray(source.X.toarray() if hasattr(source.X, "toarray") else source.X)
    genes = [str(g) for g in source.var_names]
    effects = plan_effects(
        genes,
        pool.mean(axis=0),
        n_perturbations=args.n_perturbations,
        genes_per_perturbation=args.genes_per_perturbation,
        seed=args.plan_seed,
    )
    held_out = list(effects)[-args.held_out :] if args.held_out > 0 else []
    # The screen and the redraw come from disjoint halves of the pool: no real cell in both.
    halves = split_pool(len(pool), 2, args.plan_seed)
    names = np.asarray(source.obs_names)
    for path, seed, rows in (
        (args.out, args.seed, halves[0]),
        (args.redraw, args.seed + 1, halves[1]),
    ):
        if path is None:
            continue
        draw = draw_screen(
            pool[rows],
            genes,
            effects,
            cells_per_perturbation=args.cells_per_perturbation,
            n_control=args.n_control,
            seed=seed,
        )
        uns = planted_truth_uns(
            effects, control_label=CONTROL_LABEL, plan_seed=args.plan_seed, draw_seed=seed
        )
        uns.update(source=str(args.source), base_label=args.base_label, held_out=held_out)
        write_screen(path, draw, genes, names[rows], held_out, uns)
        print(f"wrote {path} (SEMI-SYNTHETIC, {len(draw.labels)} cells, draw seed {seed})")
    if args.split_json is not None:
        args.split_json.write_text(json.dumps({"cell_type": [], "pert": held_out}, indent=2))
        print(f"wrote {args.split_json} (held-out perturbations {held_out})")


if __name__ == "__main__":
    main()
