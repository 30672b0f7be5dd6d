"""The offline driver: a plan's cells, batch by batch, through an in-process engine.

``run_plan`` is what every Python API call, ``sedd generate/predict/impute``, shard jobs and the
st3-compatible scripts run, on the one ``sedd.request.plan.plan``. It takes the plan's jobs,
one per ``batch_size`` cells, and ticks an ``Engine`` (the server's loop) in this thread until
each is done; ``on_batch`` sees each finished batch before the next one ends. An imputation
with ``n_samples`` k runs each batch k times (``Plan.draw_jobs``): ``on_batch`` sees the first
draw, ``on_layers`` the batch's mean over all k once its last draw ends (and, with ``expected``,
the mean of its expected counts), so a run holds one batch's sums, never k copies of its cells.
A ``sedd.engine.monitor.Monitor`` (the engine's observer) counts its forwards and finished
cells; its snapshot becomes the result's ``stats``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from sedd.defaults import resolve_threads
from sedd.diffusion.sampling import Sampler
from sedd.engine import (
    Engine,
    EngineJob,
    EngineSettings,
    JobResult,
    ModelLimits,
    StepProgress,
    engine_record,
    forward_rows,
    model_sampler,
    run_jobs,
)
from sedd.engine.monitor import Monitor, MonitorSnapshot
from sedd.engine.offline import ProgressHook
from sedd.io.tokens import tokens_to_counts
from sedd.precision import PrecisionPolicy
from sedd.request.draws import EXPECTED_LAYER, MEAN_LAYER, DrawMean
from sedd.request.plan import Plan


@dataclass
class GenerationResult:
    counts: np.ndarray | None  # (N, G) int64; None when the run streamed its batches away
    genes: list[str]
    obs: pd.DataFrame
    stats: dict[str, object] = field(default_factory=dict)
    # (N, G) float32 layers by name: the mean over the request's n_samples draws (MEAN_LAYER,
    # several draws) and the expected counts (EXPECTED_LAYER, ``expected``); empty when streamed
    layers: dict[str, np.ndarray] = field(default_factory=dict)
    # what the engine ran on: rows and tokens a forward, rows a tick (``engine_record``)
    engine: dict[str, object] = field(default_factory=dict)


def run_plan(
    plan: Plan,
    precision: PrecisionPolicy,
    *,
    cell_range: range | None = None,
    on_progress: ProgressHook | None = None,
    on_batch: Callable[[range, np.ndarray], None] | None = None,
    on_layers: Callable[[range, dict[str, np.ndarray]], None] | None = None,
    keep_counts: bool = True,
    sampler: Sampler | None = None,
    settings: EngineSettings | None = None,
) -> GenerationResult:
    """Generate the cells of ``plan`` (or only those in ``cell_range``, for sharding).

    ``on_progress`` is called after every engine step with the batch's ``StepProgress``;
    ``on_batch(cells, counts)`` sees each finished batch (global cell numbers, (B, G) counts),
    e.g. to save it before the next one finishes; with ``n_samples`` > 1 it sees the first draw.
    ``on_layers(cells, layers)`` sees the batch's (B, G) float32 layers once its last draw ends,
    after its ``on_batch``: ``MEAN_LAYER``, the mean over every draw (``n_samples`` > 1), and
    ``EXPECTED_LAYER``, the mean of the draws' expected counts (``expected``).
    ``keep_counts=False`` keeps no batch after these (a run of any size then holds a few batches
    at a time; ``counts`` is None and ``layers`` empty). With draws, ``stats`` counts every draw's
    cells (the engine's work) and records ``n_samples``.
    ``settings``: the engine's batch size, forward block and CUDA graphs (default
    ``EngineSettings()``). ``sampler``: the one to step on, a ``sedd.engine.model_sampler`` of
    this ``precision`` and the settings' forward block (the Python API keeps one per model, so
    its CUDA graphs are captured once); None builds a new one. ``engine`` in the result records
    the forward shape the engine ran (every output's provenance).
    """
    settings = EngineSettings() if settings is None else settings
    threads = resolve_threads(settings.threads)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)  # where sampling starts: whatever ran before changed it
    loaded, request = plan.loaded, plan.request
    cells = cell_range if cell_range is not None else range(len(plan))
    if cells.start < 0 or cells.stop > len(plan):
        raise ValueError(f"cell_range {cells} is outside the request's 0..{len(plan)} cells.")
    num_genes, mask = loaded.config.num_genes, loaded.config.tokens.mask_index
    block = forward_rows(loaded, settings.tokens_per_forward)  # what model_sampler runs
    if sampler is None:
        sampler = model_sampler(
            loaded, precision,
            tokens_per_forward=settings.tokens_per_forward, cuda_graphs=settings.cuda_graphs,
        )  # fmt: skip
    elif (sampler.precision, sampler.block_rows) != (precision, block):
        raise ValueError(
            f"`sampler` runs {sampler.precision.name} forwards of {sampler.block_rows} rows, this "
            f"run {precision.name} forwards of {block}; pass model_sampler(...) of the run's "
            "precision and tokens_per_forward."
        )
    monitor = Monitor(loaded.device, num_genes)
    engine = Engine(
        sampler,
        ModelLimits.of_model(loaded),
        max_rows_per_forward=-(-settings.batch_size // block) * block,  # whole blocks
        observer=monitor,
    )
    draws = request.n_samples
    names = ([MEAN_LAYER] if draws > 1 else []) + ([EXPECTED_LAYER] if request.expected else [])
    batches: list[tuple[range, int]] = []  # (cells, draw) of each job
    parts: list[np.ndarray] = []
    layer_parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    # per layer, the draws of the batch in flight (they finish in order)
    summed = {name: DrawMean(draws) for name in names}
    fallbacks = 0

    def jobs() -> Iterator[EngineJob]:  # built as the engine needs them
        for batch, draw, job in plan.draw_jobs(cells, batch_size=settings.batch_size):
            batches.append((batch, draw))
            yield job

    def finished(index: int, result: JobResult) -> None:
        nonlocal fallbacks, summed
        counts = tokens_to_counts(result.tokens, mask)  # (B, G)
        fallbacks += result.fp32_fallbacks
        batch, draw = batches[index]
        if draw == 0:
            if on_batch is not None:
                on_batch(batch, counts)
            if keep_counts:
                parts.append(counts)
        if not names:
            return
        expected = None if result.expected is None else result.expected.numpy()  # (B, G)
        values = {MEAN_LAYER: counts, EXPECTED_LAYER: expected}
        for name in names:
            summed[name].add(values[name])  # type: ignore[arg-type]
        if not summed[names[0]].complete:
            return
        layers = {name: summed[name].mean() for name in names}  # (B, G) float32 each
        summed = {name: DrawMean(draws) for name in names}
        if on_layers is not None:
            on_layers(batch, layers)
        if keep_counts:
            for name in names:
                layer_parts[name].append(layers[name])

    with monitor:
        run_jobs(engine, jobs(), finished, on_progress=on_progress)
        stats = run_stats(monitor.snapshot(), fallbacks)
    if draws > 1:
        stats["n_samples"] = draws
    counts = np.concatenate(parts) if parts else np.zeros((0, num_genes), dtype=np.int64)
    empty = np.zeros((0, num_genes), np.float32)
    layers = {name: np.concatenate(got) if got else empty for name, got in layer_parts.items()}
    return GenerationResult(
        counts if keep_counts else None,
        list(loaded.config.genes),
        plan.cells.iloc[cells.start : cells.stop],
        stats,
        layers if keep_counts else {},
        engine_record(engine),
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
        # what a cell cost: its forwards, and the genes it drew per forward
        "forwards_per_cell": snapshot.forwards_per_cell,
        "genes_per_forward": snapshot.genes_per_forward,
        "peak_memory_mib": snapshot.memory_peak_mib,
        "peak_memory_kind": snapshot.memory_kind,
        "current_memory_mib": snapshot.memory_current_mib,
        "fp32_fallbacks": fp32_fallbacks,
    }
    if snapshot.gpu_utilization_pct is not None:
        stats["gpu_utilization_pct"] = snapshot.gpu_utilization_pct
        stats["gpu_memory_used_mib"] = snapshot.gpu_memory_used_mib
    return stats


@contextmanager
def progress_bar(num_cells: int, desc: str) -> Iterator[ProgressHook]:
    """A tqdm bar counting whole cells (a cell counts once its work is done, whenever that is:
    an adaptive sampler's cells finish at different forwards); yields the engine's progress
    hook. ``tqdm.auto``: a widget in notebooks, text in a terminal."""
    with tqdm(total=num_cells, unit="cell", desc=desc) as bar:

        def hook(update: StepProgress) -> None:
            whole = min(bar.n + update.finished, num_cells)
            if whole > bar.n:
                bar.update(whole - bar.n)

        yield hook


def interactive() -> bool:
    """True in a notebook or IPython, at a Python prompt, or with a terminal on stderr: where
    the Python API shows progress bars unless ``progress=False``."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    if shell is not None or hasattr(sys, "ps1"):
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())
