"""``sedd evaluate --perturbation --model PATH``: the generated side of the perturbation report
drawn from the model itself, through the library's one path (``Model.generate(like=...)``):
as many cells of each held-out label the model knows as the held-out real cells have, capped by
``--max-cells``; labels it does not know are warned about and skipped."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from sedd.commands.args import add_model_arguments, add_option_argument, add_precision_argument
from sedd.defaults import SamplingOptions

if TYPE_CHECKING:
    import anndata
    from rich.console import Console

GENERATED_NAME = "generated_cells.h5ad"
# The obs column the library writes every generated cell's label to.
GENERATED_KEY = "condition"
UNKNOWN_REASON = "the model does not know this label: no cells generated"


@dataclass
class ModelCells:
    """Cells generated for the held-out labels, where they were written and what was left out."""

    cells: anndata.AnnData
    path: Path
    model: str
    unknown: list[str]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--model`` (and how it loads), ``--steps``, ``--precision``, ``--device``."""
    add_model_arguments(p)
    steps = next(option for option in fields(SamplingOptions) if option.name == "steps")
    add_option_argument(p, steps)
    add_precision_argument(
        p, "with --model: autocast dtype of the model forward (auto: bf16 where it is fast)"
    )
    p.add_argument(
        "--device", default=None, help="with --model: cpu, cuda, ... (default: cuda if any)"
    )


def label_counts(labels: list[str], max_cells: int | None) -> dict[str, int]:
    """Cells to generate per label: as many as the real cells have, capped by ``max_cells``."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    if max_cells is None:
        return counts
    return {label: min(n, max_cells) for label, n in counts.items()}


def generate_for_real(
    args: argparse.Namespace,
    real_labels: list[str],
    out_dir: Path,
    console: Console,
) -> ModelCells:
    """Generate the held-out label mix with ``args.model`` and write it to ``out_dir``."""
    import anndata as ad
    import numpy as np
    import pandas as pd

    from sedd.api import Model
    from sedd.commands.loading import load_from_args
    from sedd.io.write import write_h5ad_atomic
    from sedd.precision import resolve_precision

    loaded = load_from_args(args)
    model = Model(loaded, resolve_precision(args.precision, loaded.device))
    known = set(model.conditions)
    wanted = label_counts(real_labels, args.max_cells)
    unknown = sorted(label for label in wanted if label not in known)
    if unknown:
        console.print(
            f"[yellow]warning:[/yellow] {model} does not know {len(unknown)} held-out label(s), "
            f"skipped: {unknown}",
            highlight=False,
        )
    mix = {label: n for label, n in wanted.items() if label in known}
    if not mix:
        raise ValueError(
            f"the model knows none of the held-out labels {sorted(wanted)[:5]}; pass a real file "
            f"whose perturbation column uses the model's labels (e.g. {model.conditions[:3]})."
        )
    # the label mix as an obs-only AnnData: Model.generate(like=...) copies it
    labels = np.repeat(list(mix), list(mix.values()))
    obs = pd.DataFrame({GENERATED_KEY: labels}, index=[str(i) for i in range(len(labels))])
    like = ad.AnnData(obs=obs)
    console.print(f"generating {sum(mix.values())} cells for {len(mix)} labels with {model} ...")
    cells = model.generate(
        like=like, condition_key=GENERATED_KEY, steps=args.steps, seed=args.seed, progress=False
    )
    path = out_dir / GENERATED_NAME
    write_h5ad_atomic(cells, path)
    console.print(f"wrote {path}")
    return ModelCells(cells, path, str(loaded.path), unknown)
