"""st3's sampling pattern against our default, on one model, in one run: cells/s, quality, MFU.

* ``st3``: what st3's scripts do: one cell per sampler call and per forward (one-row forward
  blocks), 50 uniform steps and the denoise, the forward under the same autocast. On a CPU
  with the bundled model that is ``sedd generate --steps 50 --batch-size 1``.
* ``default``: ``sedd generate`` with its defaults (the tuned schedule, ``sedd.defaults``; 64
  cells in flight; the device's forward block).

Both generate the held-out split's label composition (one cell per held-out cell), in chunks
that alternate between the two arms, so that drift in machine load hits both alike; chunk k
uses seed ``seed * 1000 + k`` in both arms. Each arm's cells are then scored with
``sedd.eval.quality`` against the held-out cells. MFU is measured on a forward of the row
block the default uses (``sedd.bench.flops``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sedd.api import Model
from sedd.bench.flops import forward_flops, forward_seconds, matmul_flops_per_s
from sedd.checkpoints import LoadedModel
from sedd.defaults import DEFAULT_ENTROPY_BOUND, LIBRARY_SCHEDULE, Schedule, resolve_schedule
from sedd.engine.forwards import block_rows_for
from sedd.eval.quality import HeldOut
from sedd.precision import PrecisionPolicy, resolve_precision


@dataclass(frozen=True)
class Arm:
    name: str
    steps: int
    grid: str
    batch_size: int
    sampler: str = "euler"
    entropy_bound: float = DEFAULT_ENTROPY_BOUND


def arms(schedule: Schedule = LIBRARY_SCHEDULE) -> tuple[Arm, Arm]:
    """(st3's pattern: 50 uniform Euler steps a cell at a time, our default: the model's
    ``schedule``)."""
    default = resolve_schedule(None, None, default=schedule)
    ours = Arm("default", default["steps"], default["time_grid"], 64, default["sampler"],
               default["entropy_bound"])  # fmt: skip
    return Arm("st3", 50, "uniform", 1), ours


def compare(
    loaded: LoadedModel,
    policy: PrecisionPolicy,
    data: str | Path,
    *,
    seed: int = 0,
    chunks: int = 5,
    label_key: str | None = None,
) -> dict[str, object]:
    """Both arms over the held-out composition of ``data``; figures per arm and their ratio."""
    key = label_key or loaded.config.label_key or "bulk_labels"
    held_out = HeldOut.from_file(data, loaded.config.genes, key)
    labels = held_out.test_labels
    st3_arm, default_arm = arms(loaded.schedule)
    one_row = Model(loaded, policy, tokens_per_forward=loaded.config.num_genes)
    runs = {
        st3_arm.name: _ArmRun(st3_arm, one_row),
        default_arm.name: _ArmRun(default_arm, Model(loaded, policy)),
    }
    bounds = np.linspace(0, len(labels), min(chunks, len(labels)) + 1).astype(int)
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        order = list(runs.values()) if k % 2 == 0 else list(runs.values())[::-1]
        for run in order:
            run.add(labels[lo:hi], seed * 1000 + k)
    out: dict[str, object] = {
        "cells": len(labels),
        "chunks": len(bounds) - 1,
        # the real figure for sets of this size and label mix (the arms' sets are both)
        "held_out_within_label_agreement": held_out.held_out_agreement(),
    }
    for name, run in runs.items():
        out[name] = {**run.figures(), "quality": held_out.figures(run.counts(), labels)}
    st3, ours = out["st3"], out["default"]
    out["speedup_cells_per_s"] = ours["cells_per_s"] / st3["cells_per_s"]  # type: ignore[index]
    return out


class _ArmRun:
    """One arm's chunks: their counts, wall time and model calls."""

    def __init__(self, arm: Arm, model: Model) -> None:
        self.arm, self.model = arm, model
        self.parts: list[np.ndarray] = []
        self.seconds, self.calls, self.cell_forwards = 0.0, 0, 0.0

    def add(self, labels: Sequence[str], seed: int) -> None:
        arm = self.arm
        start = time.perf_counter()
        adata = self.model.generate(
            1, condition=list(labels), steps=arm.steps, time_grid=arm.grid,  # type: ignore[arg-type]
            sampler=arm.sampler, entropy_bound=arm.entropy_bound, seed=seed,
            batch_size=arm.batch_size,
        )  # fmt: skip
        self.seconds += time.perf_counter() - start
        self.calls += int(adata.uns["sedd"]["timings"]["forwards"])
        self.cell_forwards += float(adata.uns["sedd"]["timings"]["forwards_per_cell"]) * len(labels)
        self.parts.append(adata.X.toarray())

    def counts(self) -> np.ndarray:
        return np.concatenate(self.parts)

    def figures(self) -> dict[str, object]:
        cells = sum(len(p) for p in self.parts)
        return {
            "sampler": self.arm.sampler,
            "steps": self.arm.steps,
            "time_grid": self.arm.grid,
            **({"entropy_bound": self.arm.entropy_bound} if self.arm.sampler == "entropy" else {}),
            "forwards_per_cell": self.cell_forwards / max(cells, 1),
            "batch_size": self.arm.batch_size,
            "seconds": self.seconds,
            "cells_per_s": cells / self.seconds,
            "model_calls": self.calls,
        }


def mfu(loaded: LoadedModel, policy: PrecisionPolicy, repeats: int = 10) -> dict[str, object]:
    """MFU of one forward of the default's row block, fp32 and under ``policy``'s autocast,
    each against a 2048^2 matmul in its own dtype measured here (and bf16 against fp32's)."""
    device = policy.device
    genes = loaded.config.num_genes
    rows = block_rows_for(genes, device)
    gen = torch.Generator().manual_seed(0)
    mask = loaded.config.tokens.mask_index
    x = torch.randint(0, mask, (rows, genes), generator=gen)
    x = torch.where(torch.rand(rows, genes, generator=gen) < 0.5, mask, x).to(device)
    sigma = torch.ones(rows, device=device)
    cond = {}
    if loaded.config.num_perturbations:
        cond["labels"] = torch.zeros(rows, dtype=torch.long, device=device)
    if loaded.config.cell_types:
        cond["cell_types"] = torch.zeros(rows, dtype=torch.long, device=device)
    flops = forward_flops(loaded.model, x, sigma, **cond)
    peak32 = matmul_flops_per_s(device, torch.float32)
    out: dict[str, object] = {"rows": rows, "flops_per_forward": flops, "fp32_matmul": peak32}
    fp32 = resolve_precision("fp32", device)
    for name, pol in {"fp32": fp32, policy.name: policy}.items():
        seconds = forward_seconds(loaded.model, pol, x, sigma, repeats, **cond)
        achieved = flops / seconds
        entry = {"ms_per_forward": 1000 * seconds, "flops_per_s": achieved}
        entry["mfu_vs_fp32_matmul"] = achieved / peak32
        if pol.amp_dtype is not None:
            own = matmul_flops_per_s(device, pol.amp_dtype)
            entry[f"{name}_matmul"] = own
            entry[f"mfu_vs_{name}_matmul"] = achieved / own
        out[name] = entry
    return out
