"""Generate cells from a loaded checkpoint: the one entry point the CLI, scripts and server share.

Cells are numbered 0..N-1 across the whole request (condition by condition); cell i draws from
its own random stream (seed, i) (``sedd.sampling.cell_generators``), so its tokens do not depend on
the batch size or on which batch or shard ran it. A ``sedd.monitor.Monitor`` watches the run and
its snapshot becomes the result's ``stats`` (``run_stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch

from sedd.batch.conditions import known_perturbations
from sedd.cells import tokens_to_counts
from sedd.checkpoints import LoadedModel
from sedd.monitor import Monitor, MonitorSnapshot
from sedd.precision import PrecisionPolicy
from sedd.sampling import AnalyticSampler, EulerSampler, Sampler, StepStats

SamplerName = Literal["euler", "analytic"]


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate. ``conditions`` are perturbation names (conditional models only); a
    name listed k times gets k x ``cells_per_condition`` cells."""

    cells_per_condition: int
    conditions: tuple[str, ...] | None = None
    cell_type: str | None = None
    steps: int = 50
    sampler: SamplerName = "euler"
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 64

    def validate(self) -> None:
        checks = {
            "cells_per_condition": (self.cells_per_condition >= 1, ">= 1"),
            "steps": (self.steps >= 1, ">= 1"),
            "temperature": (self.temperature > 0, "> 0"),
            "seed": (self.seed >= 0, ">= 0"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {getattr(self, name)}.")
        if self.sampler not in ("euler", "analytic"):
            raise ValueError(f"`sampler` must be 'euler' or 'analytic', got {self.sampler!r}.")


@dataclass
class GenerationResult:
    counts: np.ndarray  # (N, G) int64
    genes: list[str]
    obs: pd.DataFrame
    stats: dict[str, object] = field(default_factory=dict)


def make_sampler(loaded: LoadedModel, name: SamplerName, precision: PrecisionPolicy) -> Sampler:
    cls = {"euler": EulerSampler, "analytic": AnalyticSampler}[name]
    return cls(loaded.model, loaded.noise, loaded.graph, precision=precision, device=loaded.device)


def cell_plan(loaded: LoadedModel, request: GenerationRequest) -> pd.DataFrame:
    """One row per cell to generate: condition name, index and cell type, in cell order."""
    known = known_perturbations(loaded)
    conditional = loaded.config.num_perturbations > 0
    if conditional and not request.conditions:
        raise ValueError(
            f"this model is conditioned on perturbations: pass `conditions` (known: "
            f"{', '.join(known[:10]) or 'none named'}{', ...' if len(known) > 10 else ''})."
        )
    if not conditional and request.conditions:
        raise ValueError(
            f"this model is unconditional: `conditions` must be empty, got {request.conditions}."
        )
    conditions = list(request.conditions) if conditional else [None]
    for name in conditions:
        if name is not None:
            loaded.perturbation_labels([name])  # raises UnknownLabelError with suggestions
    if request.cell_type is not None:
        loaded.cell_type_index(request.cell_type)
    n = request.cells_per_condition
    rows = [
        {"perturbation": name, "sample_idx": j, "cell_type": request.cell_type}
        for name in conditions
        for j in range(n)
    ]
    plan = pd.DataFrame(rows)
    if conditional:  # a condition may be listed more than once: number its cells on
        plan["sample_idx"] = plan.groupby("perturbation", sort=False).cumcount()
    if not conditional:
        plan = plan.drop(columns="perturbation")
    else:
        plan["perturbation_idx"] = [
            known.index(p) if p in known else -1 for p in plan["perturbation"]
        ]
    if request.cell_type is None:
        plan = plan.drop(columns="cell_type")
    plan.index = [f"cell_{i}" for i in range(len(plan))]
    return plan


def plan_labels(
    loaded: LoadedModel, plan: pd.DataFrame, device: torch.device | str | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(perturbation labels, cell-type labels) of a ``cell_plan`` slice, each (N,) or None, on
    ``device`` (default: the model's). The engine takes them on the CPU."""
    labels = (
        loaded.perturbation_labels(list(plan["perturbation"])) if "perturbation" in plan else None
    )
    cell_types = loaded.cell_type_labels(list(plan["cell_type"])) if "cell_type" in plan else None
    if device is None:
        return labels, cell_types
    return (
        None if labels is None else labels.to(device),
        None if cell_types is None else cell_types.to(device),
    )


def generate(
    loaded: LoadedModel,
    request: GenerationRequest,
    precision: PrecisionPolicy,
    *,
    cell_range: range | None = None,
    on_step: Callable[[StepStats], None] | None = None,
    on_batch: Callable[[range, np.ndarray], None] | None = None,
) -> GenerationResult:
    """Generate the cells of ``request`` (or only those in ``cell_range``, for sharding).

    ``on_batch(cells, counts)`` sees each finished batch (global cell numbers, (B, G) counts),
    e.g. to save it before the next one starts.
    """
    request.validate()
    plan = cell_plan(loaded, request)
    cells = cell_range if cell_range is not None else range(len(plan))
    if cells.start < 0 or cells.stop > len(plan):
        raise ValueError(f"cell_range {cells} is outside the request's 0..{len(plan)} cells.")
    sampler = make_sampler(loaded, request.sampler, precision)
    fallbacks_before = precision.fp32_fallbacks
    num_genes = loaded.config.num_genes
    monitor = Monitor(loaded.device, num_genes)

    def count(stats: StepStats) -> None:
        monitor.on_step(stats)
        if on_step is not None:
            on_step(stats)

    batches: list[np.ndarray] = []
    with monitor:
        for lo in range(cells.start, cells.stop, request.batch_size):
            hi = min(lo + request.batch_size, cells.stop)
            part = plan.iloc[lo:hi]
            labels, cell_types = plan_labels(loaded, part)
            tokens = sampler.sample(
                hi - lo,
                steps=request.steps,
                num_genes=num_genes,
                seed=request.seed,
                first_cell=lo,
                labels=labels,
                cell_types=cell_types,
                temperature=request.temperature,
                on_step=count,
            )
            batch_counts = tokens_to_counts(tokens, loaded.config.tokens.mask_index)
            monitor.add_cells(hi - lo)
            if on_batch is not None:
                on_batch(range(lo, hi), batch_counts)
            batches.append(batch_counts)
        stats = run_stats(monitor.snapshot(), precision.fp32_fallbacks - fallbacks_before)
    counts = np.concatenate(batches) if batches else np.zeros((0, num_genes), dtype=np.int64)
    return GenerationResult(
        counts, list(loaded.config.genes), plan.iloc[cells.start : cells.stop], stats
    )


def run_stats(snapshot: MonitorSnapshot, fp32_fallbacks: int) -> dict[str, object]:
    """The stats every output reports (summary line, metrics JSON, h5ad provenance).

    Rates are over the run's wall time (0 for an empty run). Peak memory is CUDA's max allocated
    since the run started, or on CPU the process's peak RSS (``peak_memory_kind`` says which);
    ``current_memory_mib`` is the same kind at the end. GPU fields appear only where NVML works.
    """
    stats: dict[str, object] = {
        "cells": snapshot.cells,
        "seconds": snapshot.seconds,
        "cells_per_s": snapshot.cells_per_s,
        "tokens_per_s": snapshot.tokens_per_s,
        "forwards": snapshot.forwards,
        "forwards_per_s": snapshot.forwards_per_s,
        "peak_memory_mib": snapshot.memory_peak_mib,
        "peak_memory_kind": snapshot.memory_kind,
        "current_memory_mib": snapshot.memory_current_mib,
        "fp32_fallbacks": fp32_fallbacks,
    }
    if snapshot.gpu_utilization_pct is not None:
        stats["gpu_utilization_pct"] = snapshot.gpu_utilization_pct
        stats["gpu_memory_used_mib"] = snapshot.gpu_memory_used_mib
    return stats
