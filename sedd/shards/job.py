"""Run one shard of a request into an output directory, resuming whatever an earlier run finished.

``prepare_shard`` checks ``DIR/request.json`` (claiming it on the first run), then looks at what
is on disk: a shard whose entry and h5ad hash match is done; otherwise the finished batches
(part files) are kept and only the missing cells are generated. ``ShardJob.run`` generates them,
saving each batch as a part file (temp + rename) the moment it is done, then writes the shard
h5ad (atomic), then its entry (atomic), then removes the parts. A kill at any point loses at most
the batch being sampled. File layout: ``sedd.shards.manifest``.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sedd.checkpoints import LoadedModel
from sedd.engine import EngineSettings, StepProgress
from sedd.io.cell_writer import CellWriter
from sedd.io.files import sha256_file, write_json_atomic
from sedd.precision import PrecisionPolicy
from sedd.request.plan import GenerationRequest, Plan
from sedd.request.provenance import run_provenance
from sedd.run import run_plan
from sedd.shards.manifest import (
    ShardOutputError,
    ShardPaths,
    claim_request_file,
    read_json,
    regular_file,
    request_identity,
    request_record,
    shard_entry,
)
from sedd.shards.ranges import Shard

_PART = re.compile(r"^cells-(\d+)-(\d+)\.npz$")
# ``generate`` stats that describe the moment a run ended, not a sum over runs
_LAST_RUN_KEYS = (
    "peak_memory_kind",
    "current_memory_mib",
    "gpu_utilization_pct",
    "gpu_memory_used_mib",
)


@dataclass
class ShardJob:
    """One shard's work, as found on disk; ``run`` finishes it."""

    plan: Plan  # the whole request's, planned once
    precision: PrecisionPolicy
    shard: Shard
    paths: ShardPaths
    cells: range  # the shard's global cell numbers
    identity_sha256: str
    done_entry: dict[str, Any] | None  # the entry, when the shard is already complete
    settings: EngineSettings = field(default_factory=EngineSettings)
    block_rows: int = 1  # every forward's rows, as the identity records them
    # first cell -> cells of each finished batch on disk (the counts stay there, not in memory)
    parts: dict[int, int] = field(default_factory=dict)

    @property
    def loaded(self) -> LoadedModel:
        return self.plan.loaded

    @property
    def request(self) -> GenerationRequest:
        return self.plan.request

    @property
    def parts_dir(self) -> Path:
        return self.paths.parts_dir(self.identity_sha256)

    @property
    def resumed_cells(self) -> int:
        return sum(self.parts.values())

    def gaps(self) -> list[range]:
        """The cell ranges no part covers yet, in order."""
        missing, position = [], self.cells.start
        for start in sorted(self.parts):
            if start > position:
                missing.append(range(position, start))
            position = start + self.parts[start]
        if position < self.cells.stop:
            missing.append(range(position, self.cells.stop))
        return missing

    @property
    def cells_to_generate(self) -> int:
        return 0 if self.done_entry is not None else sum(len(gap) for gap in self.gaps())

    def run(self, on_progress: Callable[[StepProgress], None] | None = None) -> dict[str, Any]:
        """Generate the missing cells, write the shard h5ad and its entry; return the entry."""
        if self.done_entry is not None:
            return self.done_entry
        resumed = self.resumed_cells
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        results = [
            run_plan(
                self.plan, self.precision, cell_range=gap, on_progress=on_progress,
                on_batch=self._save_part, settings=self.settings,
            )
            for gap in self.gaps()
        ]  # fmt: skip
        stats = self._shard_stats([result.stats for result in results], resumed)
        self._write_h5ad(shard_provenance(self, stats, results[-1].engine if results else None))
        entry = shard_entry(
            shard=self.shard,
            cells=self.cells,
            identity_sha256=self.identity_sha256,
            seed=self.request.sampling.seed,
            h5ad=self.paths.h5ad,
            h5ad_sha256=sha256_file(self.paths.h5ad),
            stats=stats,
            precision_record=self.precision.record(stats["fp32_fallbacks"]),
            resumed_cells=resumed,
        )
        write_json_atomic(self.paths.entry, entry)
        shutil.rmtree(self.parts_dir, ignore_errors=True)
        return entry

    def _shard_stats(self, runs: list[dict[str, Any]], resumed: int) -> dict[str, Any]:
        """The shard's figures: totals over its runs (one per gap), rates over their time."""
        totals: dict[str, Any] = {"seconds": 0.0, "forwards": 0, "fp32_fallbacks": 0}
        for run in runs:
            for key in totals:
                totals[key] += run[key]
        # the memory and GPU figures of the last run (peak: the largest of all runs)
        last: dict[str, Any] = {"peak_memory_kind": "none", "current_memory_mib": 0.0}
        if runs:
            last = {key: value for key, value in runs[-1].items() if key in _LAST_RUN_KEYS}
        new_cells, seconds = len(self.cells) - resumed, totals["seconds"]
        # what a cell cost, over the cells generated here (a run's figures are per its cells)
        cell_forwards = sum(float(run.get("forwards_per_cell", 0.0)) * int(run.get("cells", 0))
                            for run in runs)  # fmt: skip
        genes = sum(float(run.get("genes_per_forward", 0.0)) * float(run.get("forwards_per_cell",
                    0.0)) * int(run.get("cells", 0)) for run in runs)  # fmt: skip

        def rate(count: int) -> float:
            # an empty shard (more shards than cells) has no rate: report 0, not NaN
            return count / seconds if seconds > 0 else 0.0

        return {
            "cells": len(self.cells),
            "cells_generated": new_cells,
            "cells_resumed": resumed,
            **totals,
            "cells_per_s": rate(new_cells),
            "tokens_per_s": rate(new_cells * self.loaded.config.num_genes),
            "forwards_per_s": rate(totals["forwards"]),
            "forwards_per_cell": cell_forwards / new_cells if new_cells > 0 else 0.0,
            "genes_per_forward": genes / cell_forwards if cell_forwards > 0 else 0.0,
            "peak_memory_mib": max((float(run["peak_memory_mib"]) for run in runs), default=0.0),
            **last,
        }

    def _save_part(self, cells: range, counts: np.ndarray) -> None:
        part = sp.csr_matrix(counts.astype(np.int32 if counts.max(initial=0) < 2**31 else np.int64))
        path = self.parts_dir / f"cells-{cells.start:012d}-{cells.stop:012d}.npz"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("wb") as f:
                sp.save_npz(f, part, compressed=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self.parts[cells.start] = len(cells)

    def _part_path(self, start: int) -> Path:
        stop = start + self.parts[start]
        return self.parts_dir / f"cells-{start:012d}-{stop:012d}.npz"

    def _write_h5ad(self, uns: dict[str, Any]) -> None:
        """The shard's h5ad, assembled on disk from its parts one at a time."""
        if sum(self.parts.values()) != len(self.cells):  # a bug, not a user error
            raise RuntimeError(f"parts hold {sum(self.parts.values())} cells of {len(self.cells)}.")
        with CellWriter(self.paths.h5ad, self.loaded.config.genes) as writer:
            for start in sorted(self.parts):
                writer.add(sp.load_npz(self._part_path(start)))
            writer.finish(self.plan.cells.iloc[self.cells.start : self.cells.stop], uns)


def shard_provenance(
    job: ShardJob, stats: dict[str, Any], engine: dict[str, object] | None
) -> dict[str, Any]:
    """The shard h5ad's ``uns``: ``engine`` is what its last run's engine ran on (None: every
    batch was already on disk, so the forward shape its identity fixes)."""
    if engine is None:
        genes = job.loaded.config.num_genes
        engine = {
            "block_rows": job.block_rows,
            "tokens_per_forward": job.block_rows * genes,
            "rows_per_tick": -(-job.settings.batch_size // job.block_rows) * job.block_rows,
        }
    shard = {
        "index": job.shard.index,
        "count": job.shard.count,
        "cell_range": [job.cells.start, job.cells.stop],
        "identity_sha256": job.identity_sha256,
    }
    return run_provenance(
        job.loaded, job.request, job.precision, stats, {"shard": shard}, engine=engine
    )


def prepare_shard(
    plan: Plan, precision: PrecisionPolicy, out_dir: Path, shard: Shard, settings: EngineSettings
) -> ShardJob:
    """Claim or check ``out_dir/request.json`` and find what this shard still has to do."""
    loaded, request, num_cells = plan.loaded, plan.request, len(plan)
    if request.n_samples != 1:
        raise ValueError(
            f"`n_samples` must be 1 for a sharded run, got {request.n_samples}: shards keep one "
            "draw of each cell; write one file (--out) for the mean of several draws."
        )
    if request.expected:
        raise ValueError(
            "`expected` must be off for a sharded run, got True: shards keep counts only; write "
            "one file (--out) for the expected counts."
        )
    identity = request_identity(
        loaded, request, precision, num_cells=num_cells, num_shards=shard.count,
        tokens_per_forward=settings.tokens_per_forward,
    )  # fmt: skip
    record = request_record(identity, model=str(loaded.path), batch_size=settings.batch_size)
    claimed = claim_request_file(out_dir, record)
    paths = ShardPaths(out_dir, shard)
    job = ShardJob(
        plan=plan,
        precision=precision,
        shard=shard,
        paths=paths,
        cells=shard.cell_range(num_cells),
        identity_sha256=claimed["identity_sha256"],
        done_entry=None,
        settings=settings,
        block_rows=identity["block_rows"],
    )
    job.done_entry = _complete_entry(job)
    if job.done_entry is None:
        _load_parts(job)
    return job


def _complete_entry(job: ShardJob) -> dict[str, Any] | None:
    """The shard's entry if it and its h5ad are intact and belong to this request."""
    entry_path, h5ad = job.paths.entry, job.paths.h5ad
    if not entry_path.exists():
        return None
    try:
        entry = read_json(entry_path, "shard entry")
    except ShardOutputError as exc:
        _note(f"{exc}; regenerating shard {job.shard.index}")
        return None
    if entry.get("identity_sha256") != job.identity_sha256:
        raise ShardOutputError(
            f"{entry_path} belongs to another request (identity "
            f"{str(entry.get('identity_sha256'))[:12]}, expected {job.identity_sha256[:12]}); "
            f"delete {job.paths.out_dir} or use a new output directory (--out-dir; st3 scripts: "
            "--output_dir)."
        )
    # a FIFO or a device there is refused (reading it would block or never end)
    if h5ad.exists() and sha256_file(regular_file(h5ad, "shard h5ad")) == entry.get("h5ad_sha256"):
        return entry
    _note(f"{h5ad} is missing or does not match its entry's sha256; regenerating it")
    entry_path.unlink(missing_ok=True)
    return None


def _load_parts(job: ShardJob) -> None:
    """Read finished batches; drop leftover temp files and anything that does not fit."""
    parts_dir = job.parts_dir
    if not parts_dir.is_dir():
        return
    num_genes = job.loaded.config.num_genes
    covered = np.zeros(len(job.cells), dtype=bool)
    for path in sorted(parts_dir.iterdir()):
        match = _PART.match(path.name)
        if match is None:  # a temp file from a killed write, or a stranger
            path.unlink(missing_ok=True)
            continue
        if not path.is_file():  # a FIFO or a device would block or never end: not read
            _note(f"ignoring {path}: not a regular file (its cells are generated again)")
            continue
        start, stop = int(match.group(1)), int(match.group(2))
        lo, hi = start - job.cells.start, stop - job.cells.start
        try:
            counts = sp.csr_matrix(sp.load_npz(path))
        except (OSError, ValueError) as exc:
            _note(f"dropping unreadable part {path} ({exc})")
            path.unlink(missing_ok=True)
            continue
        fits = 0 <= lo < hi <= len(job.cells) and counts.shape == (stop - start, num_genes)
        if not fits or covered[lo:hi].any():
            _note(f"dropping part {path}: it does not fit shard {job.shard.stem}")
            path.unlink(missing_ok=True)
            continue
        covered[lo:hi] = True
        job.parts[start] = stop - start


class ShardRepairWarning(UserWarning):
    """A shard's files were found damaged or stale and are being regenerated or dropped."""


def _note(message: str) -> None:
    warnings.warn(message, ShardRepairWarning, stacklevel=3)
