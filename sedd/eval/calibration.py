"""Calibrating a model's default schedule: the fewest forwards a cell at 50-step quality.

``sedd calibrate`` (and ``scripts/sampler_study.py``, which shares the sets and the test) generates
the held-out cells' label mix for several seeds under each candidate schedule and under the
reference (50 uniform Euler steps), scores every set with the project's quality figures
(``sedd.eval.quality.HeldOut.figures``: gene–gene correlation RMS, MMD^2 and energy distance in a
PCA fitted on the training cells, within-label agreement) and keeps the candidate with the fewest
forwards a cell whose every figure is within seed noise of the reference: no figure's mean over
seeds worse than the reference's by more than twice the standard error of the difference
(one-sided: a candidate that scores better is not penalised for it).

Sets are cached, one ``.npz`` a (candidate, seed), so a calibration resumes where it stopped and
a study that made the same sets is not run twice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sedd.defaults import Predictor, Schedule
from sedd.eval.quality import FIGURES, HeldOut

# the direction in which each figure gets worse
WORSE = {"corr_rms": 1, "mmd2_rbf": 1, "energy_distance": 1, "within_label_agreement": -1}


@dataclass(frozen=True)
class Candidate:
    """A schedule to try: for ``sampler="entropy"`` the steps are the cap on forwards a cell."""

    sampler: Predictor
    steps: int
    entropy_bound: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """``euler:STEPS``, ``analytic:STEPS`` or ``entropy:CAP:BOUND``."""
        parts = text.split(":")
        try:
            if parts[0] == "entropy" and len(parts) == 3:
                return cls("entropy", int(parts[1]), float(parts[2]))
            if parts[0] in ("euler", "analytic") and len(parts) == 2:
                return cls(parts[0], int(parts[1]))  # type: ignore[arg-type]
        except ValueError:
            pass
        raise ValueError(
            f"--candidate must be euler:STEPS, analytic:STEPS or entropy:CAP:BOUND, got {text!r}."
        )

    def name(self, seed: int) -> str:
        """The set's file stem."""
        tail = f"-b{self.entropy_bound:g}" if self.sampler == "entropy" else ""
        return f"{self.sampler}-{self.steps}{tail}-s{seed}"

    def label(self) -> str:
        if self.sampler == "entropy":
            return f"entropy, bound {self.entropy_bound:g}, cap {self.steps}"
        return f"{self.sampler}, {self.steps} uniform steps"

    def schedule(self) -> Schedule:
        return Schedule(self.sampler, self.steps, "uniform", self.entropy_bound)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sampler": self.sampler, "steps": self.steps}
        if self.sampler == "entropy":
            out["entropy_bound"] = self.entropy_bound
        return out


REFERENCE = Candidate("euler", 50)
# what ``sedd calibrate`` tries by default: the entropy-bounded sampler at bounds and caps that
# gave 6-11 forwards a cell on the bundled model, and uniform steps from as few up to 30
DEFAULT_CANDIDATES = (
    Candidate("entropy", 8, 0.0),
    Candidate("entropy", 16, 80.0),
    Candidate("entropy", 16, 110.0),
    Candidate("entropy", 16, 60.0),
    Candidate("entropy", 16, 65.0),
    Candidate("entropy", 16, 70.0),
    Candidate("euler", 8),
    Candidate("euler", 10),
    Candidate("euler", 20),
    Candidate("euler", 30),
)


@dataclass
class ScoredSet:
    """One seed's set of a candidate: what it cost and its figures."""

    forwards_per_cell: float
    genes_per_forward: float
    seconds: float
    figures: dict[str, float]


def generate_set(
    model: Any, labels: Sequence[str], candidate: Candidate, seed: int, cache: Path
) -> dict[str, Any]:
    """The candidate's cells for ``seed`` in ``labels``' mix (one cell a label entry), from
    ``cache`` when made before; else generated with ``model`` (a ``sedd.Model``) and saved."""
    path = cache / f"{candidate.name(seed)}.npz"
    if path.exists():
        with np.load(path) as stored:
            return {key: stored[key] for key in stored.files}
    start = time.perf_counter()
    adata = model.generate(
        1,
        condition=list(labels),
        steps=candidate.steps,
        sampler=candidate.sampler,
        entropy_bound=candidate.entropy_bound,
        time_grid="uniform",
        seed=seed,
        batch_size=128,
        progress=False,
    )
    timings = adata.uns["sedd"]["timings"]
    made = {
        "counts": np.asarray(adata.X.toarray(), dtype=np.int32),
        "forwards_per_cell": float(timings["forwards_per_cell"]),
        "genes_per_forward": float(timings["genes_per_forward"]),
        "seconds": time.perf_counter() - start,
    }
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez_compressed(tmp, **made)
    tmp.replace(path)
    return made


def score(held_out: HeldOut, made: dict[str, Any]) -> ScoredSet:
    figures = held_out.figures(made["counts"], held_out.test_labels)
    return ScoredSet(
        float(made["forwards_per_cell"]),
        float(made["genes_per_forward"]),
        float(made["seconds"]),
        figures,
    )


def summarise(candidate: Candidate, sets: Sequence[ScoredSet]) -> dict[str, Any]:
    """Mean and sd over seeds of every figure and of the cost."""

    def sd(values: list[float]) -> float | None:
        return float(np.std(values, ddof=1)) if len(values) > 1 else None

    return {
        **candidate.record(),
        "setting": candidate.label(),
        "seeds": len(sets),
        "forwards_per_cell": float(np.mean([s.forwards_per_cell for s in sets])),
        "genes_per_forward": float(np.mean([s.genes_per_forward for s in sets])),
        "seconds_per_set": float(np.mean([s.seconds for s in sets])),
        "mean": {f: float(np.mean([s.figures[f] for s in sets])) for f in FIGURES},
        "sd": {f: sd([s.figures[f] for s in sets]) for f in FIGURES},
    }


def worse_figures(
    row: dict[str, Any], base: dict[str, Any], directions: Mapping[str, int] = WORSE
) -> list[str]:
    """The figures on which ``row`` is worse than ``base`` by more than 2 standard errors of
    the difference of their means over seeds (every figure, with fewer than 2 seeds).
    ``directions``: each figure and the sign in which it gets worse; a figure either lacks is
    skipped."""
    if row["seeds"] < 2 or base["seeds"] < 2:
        return list(directions)
    worse = []
    for figure, sign in directions.items():
        if figure not in row["mean"] or figure not in base["mean"]:
            continue
        sd_row, sd_base = row["sd"][figure] or 0.0, base["sd"][figure] or 0.0
        se = math.sqrt(sd_row**2 / row["seeds"] + sd_base**2 / base["seeds"])
        if sign * (row["mean"][figure] - base["mean"][figure]) > 2 * se:
            worse.append(figure)
    return worse


def calibrate(
    model: Any,
    held_out: HeldOut,
    candidates: Sequence[Candidate],
    *,
    seeds: int,
    cache: Path,
    reference: Candidate = REFERENCE,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The reference and every candidate over ``seeds`` seeds (sets cached in ``cache``), and
    the choice: the fewest forwards a cell within noise of the reference on every figure; the
    reference itself when no candidate is. Returns the calibration as JSON (``Calibration``'s
    fields but the weights' hash and the command)."""
    rows = []
    for candidate in (reference, *candidates):
        sets = []
        for seed in range(seeds):
            sets.append(
                score(held_out, generate_set(model, held_out.test_labels, candidate, seed, cache))
            )
        rows.append(summarise(candidate, sets))
        say(
            f"{candidate.label()}: {rows[-1]['forwards_per_cell']:.2f} forwards a cell, "
            + ", ".join(f"{f} {rows[-1]['mean'][f]:.4f}" for f in FIGURES)
        )
    base = rows[0]
    for row in rows[1:]:
        row["worse_than_reference"] = worse_figures(row, base)
        row["within_noise"] = not row["worse_than_reference"]
    passing = [(row, c) for row, c in zip(rows[1:], candidates, strict=True) if row["within_noise"]]
    chosen_row, chosen = min(
        passing, key=lambda rc: rc[0]["forwards_per_cell"], default=(base, reference)
    )
    return {
        "schedule": chosen.schedule().record() | {"time_grid": "uniform"},
        "reference": base,
        "candidates": rows[1:],
        "chosen": {
            "setting": chosen.label(),
            "forwards_per_cell": chosen_row["forwards_per_cell"],
            "within_noise_of_reference": chosen is not reference,
        },
        "test": "no figure's mean over seeds worse than the reference's by more than 2 standard "
        "errors of the difference (one-sided)",
        "cells_per_seed": len(held_out.test_labels),
    }
