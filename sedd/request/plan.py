"""Requests and plans: what a user asks for, turned into cells and the engine's jobs.

``GenerationRequest`` is the one request type, holding one ``SamplingOptions`` value
(``sedd.defaults``) carried whole; ``plan`` is the one planning call. The Python API,
``sedd generate/predict/impute``, shard jobs and the server all build one and call it. A
``Plan`` numbers the request's cells 0..N-1 (condition by condition), once per run, and turns
any range of them into an ``EngineJob`` in which cell i draws from its own random stream
(seed, i), so a cell does not depend on the batch, shard or server request that ran it. An
imputation of N cells with ``n_samples`` k samples each k times: draw j of cell i is stream
(seed, j * N + i) (``sedd.request.draws``), so draw 0 is the one-draw cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from sedd.checkpoints import LoadedModel
from sedd.defaults import DEFAULT_BATCH_SIZE, SamplingOptions
from sedd.diffusion.expected import check_expected
from sedd.diffusion.steps import check_step_kind
from sedd.engine import EngineJob
from sedd.request.draws import check_n_samples, draw_cell_index
from sedd.request.imputation import Imputation


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate: the one request type of the API, the CLI, shard jobs and the server.

    ``conditions`` are condition names (conditional models only), generated in order; each gets
    ``cells_per_condition`` cells, or, when ``condition_counts`` is given (a label mix, or one
    condition per imputed cell as runs), its own count. A name listed k times gets k runs of
    cells, numbered on. ``sampling`` is how they are sampled, one value carried whole to each
    engine job (it checked itself when made). ``imputation`` holds observed counts that every
    cell keeps; its cells are its rows, as many as the request's cells. ``n_samples``
    (imputation only): draws of each cell, whose mean the output adds beside the first draw
    (``sedd.request.draws``); it never changes the first draw. ``expected``: also give each
    gene's expected count, the mean of the distribution it was drawn from, averaged over the
    draws (``EXPECTED_LAYER``); it never changes a cell. How an engine runs the request
    (cells in flight, rows a forward, CUDA graphs) is not part of it:
    ``sedd.engine.EngineSettings``.
    """

    cells_per_condition: int
    conditions: tuple[str, ...] | None = None
    cell_type: str | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    imputation: Imputation | None = field(default=None, compare=False, repr=False)
    condition_counts: tuple[int, ...] | None = None  # cells of each of `conditions`
    n_samples: int = 1  # draws of each imputed cell; draw j of cell i: stream (seed, j * N + i)
    expected: bool = False  # add the expected counts (``sedd.diffusion.expected``)

    def __post_init__(self) -> None:  # sequences from callers, as tuples; empty is None
        for name in ("conditions", "condition_counts"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value) or None)

    @property
    def counts(self) -> tuple[int, ...]:
        """Cells of each condition, in order (one entry for an unconditional request)."""
        if self.condition_counts is not None:
            return self.condition_counts
        return (self.cells_per_condition,) * max(len(self.conditions or ()), 1)

    @property
    def num_cells(self) -> int:
        return sum(self.counts)

    def validate(self) -> None:
        if not isinstance(self.sampling, SamplingOptions):
            raise TypeError(f"`sampling` must be a SamplingOptions, got {self.sampling!r}.")
        if self.cells_per_condition < 1:
            raise ValueError(f"`cells_per_condition` must be >= 1, got {self.cells_per_condition}.")
        counts = self.condition_counts
        if counts is not None and (len(counts) != len(self.conditions or ()) or min(counts) < 1):
            raise ValueError(
                f"`condition_counts` must give a count >= 1 for each of the "
                f"{len(self.conditions or ())} conditions, got {list(counts)}."
            )
        check_n_samples(self.n_samples)
        if self.n_samples > 1 and self.imputation is None:
            raise ValueError(
                f"`n_samples` must be 1 for cells generated without observed counts, got "
                f"{self.n_samples}: draws of such a cell are more cells of its condition; ask for "
                "k times the cells and average them by condition."
            )
        imputed = self.imputation
        if imputed is not None and imputed.num_cells != self.num_cells:
            raise ValueError(
                f"the request's cells must equal the imputation's {imputed.num_cells} cells "
                f"(one per observed cell), got {self.num_cells}."
            )

    def record(self) -> dict[str, object]:
        """The request as plain JSON values (provenance, manifests, the run id); imputation as
        its genes. Keys are those requests have always recorded, so run ids hold."""
        out: dict[str, object] = {
            "cells_per_condition": self.cells_per_condition,
            "conditions": list(self.conditions or []),
            "cell_type": self.cell_type,
            **self.sampling.record(),
        }
        if self.condition_counts is not None:  # absent otherwise: earlier identities hold
            out["condition_counts"] = list(self.condition_counts)
        if self.imputation is not None:
            out["imputed_from_genes"] = list(self.imputation.genes)
        if self.n_samples != 1:  # absent for one draw: earlier records and identities hold
            out["n_samples"] = self.n_samples
        if self.expected:  # absent when off, for the same reason
            out["expected"] = True
        return out


def cell_plan(loaded: LoadedModel, request: GenerationRequest) -> pd.DataFrame:
    """One row per cell to generate, in cell order, named ``<run id>-<cell index>`` (imputed
    cells keep the input's names).

    Columns: the label under each of ``config.label_columns`` (conditional models: ``condition``,
    the training key such as ``bulk_labels``, ``perturbation`` for perturbation models),
    ``condition_idx``, ``sample_idx`` (the cell's number within its condition), ``cell_type``
    (when one is given, or one per imputed cell), ``seed`` and ``cell_index``: the cell draws
    from stream (seed, cell_index).
    """
    known, conditional = loaded.conditions, loaded.conditional
    if conditional and not request.conditions:
        raise ValueError(
            f"this model is conditioned on {loaded.label_word}s: pass `conditions` (known: "
            f"{', '.join(known[:10]) or 'none named'}{', ...' if len(known) > 10 else ''})."
        )
    if not conditional and request.conditions:
        raise ValueError(
            f"this model is unconditional: `conditions` must be empty, got {request.conditions}."
        )
    conditions = list(request.conditions or ())
    for name in conditions:
        loaded.perturbation_labels([name])  # raises UnknownLabelError with suggestions
    if request.cell_type is not None:
        loaded.cell_type_index(request.cell_type)
    imputed = request.imputation
    given_per_cell = imputed is not None and imputed.cell_types is not None
    if getattr(loaded.config.arch, "cell_types_required", False) and request.cell_type is None \
            and not given_per_cell:  # fmt: skip
        raise ValueError(
            f"this model (st3's cell-type family) needs a cell type for every cell: pass "
            f"`cell_type` (CLI --cell-type; st3 scripts --cell_type), one of "
            f"{(loaded.config.cell_types or [])[:10]}."
        )
    cell_index = np.arange(request.num_cells)
    if imputed is not None and imputed.obs is not None:
        names = [str(c) for c in imputed.obs.index]  # the input's cells keep their names
    else:
        names = [f"{run_id(loaded, request)}-{i}" for i in cell_index]
    frame = pd.DataFrame(index=pd.Index(names, dtype=object))
    if conditional:
        labels = pd.Series(np.repeat(conditions, request.counts), index=frame.index)
        for column in loaded.config.label_columns:
            frame[column] = labels
        # the label's row in the model (an index file may leave rows unnamed, so this is not
        # always its place in `known`); vector-conditioned models: its place in the vector file
        named = loaded.config.perturbations or []
        frame["condition_idx"] = [
            named.index(p) if p in named else known.index(p) if p in known else -1 for p in labels
        ]
        # a condition may be listed more than once: number its cells on
        frame["sample_idx"] = labels.groupby(labels, sort=False).cumcount()
    else:
        frame["sample_idx"] = cell_index
    if request.cell_type is not None:
        frame["cell_type"] = request.cell_type
    if imputed is not None and imputed.cell_types is not None:
        if request.cell_type is not None:
            raise ValueError("pass one `cell_type` or a cell type per cell, not both.")
        frame["cell_type"] = list(imputed.cell_types)
    frame["seed"] = request.sampling.seed
    frame["cell_index"] = cell_index
    if imputed is not None and imputed.obs is not None:
        frame = _with_input_columns(frame, imputed.obs)
    return frame


def _with_input_columns(frame: pd.DataFrame, given: pd.DataFrame) -> pd.DataFrame:
    """The input's obs columns first, then ours; an input column whose name we use with other
    values is kept as ``input_<name>``."""
    kept = {}
    for column in given.columns:
        values = given[column].to_numpy()
        name = str(column)
        if name in frame.columns:
            ours = frame[name].to_numpy()
            if len(ours) == len(values) and (ours.astype(str) == values.astype(str)).all():
                continue  # the same labels: ours stand for both
            name = f"input_{name}"
        kept[name] = values
    merged = pd.DataFrame(kept, index=frame.index)
    for column in frame.columns:  # by position: input cell names may repeat
        merged[column] = frame[column].to_numpy()
    return merged


def run_id(loaded: LoadedModel, request: GenerationRequest) -> str:
    """8 hex digits naming a request's cells: the same for the same model and request (its
    number of draws and ``expected`` aside, which never change a cell), different
    for another seed, condition list, cell type, sampler setting or imputed input."""
    identity = request.record()
    identity.pop("n_samples", None)
    identity.pop("expected", None)
    identity["model_sha256"] = loaded.file_hash
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    if request.imputation is not None:
        digest.update(request.imputation.x_init.numpy().tobytes())
    return digest.hexdigest()[:8]


def plan_labels(
    loaded: LoadedModel, plan: pd.DataFrame
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(perturbation labels, cell-type labels) of a ``cell_plan`` slice, each (N,) or None, on
    the CPU: planning never touches the device (the server plans on its event loop), and the
    engine moves a job's labels once, when its rows join."""
    labels = loaded.perturbation_labels(list(plan["condition"])) if "condition" in plan else None
    cell_types = loaded.cell_type_labels(list(plan["cell_type"])) if "cell_type" in plan else None
    return labels, cell_types


@dataclass(frozen=True, eq=False)
class Plan:
    """A validated request and its cells, planned once (``plan``).

    ``cells`` has one row per cell, in cell order (``cell_plan``'s columns); ``job`` and
    ``jobs`` turn ranges of them into engine jobs: cell i draws from stream (seed, i), i its
    number in the whole request; draw j of cell i (``n_samples`` > 1) from stream
    (seed, j * N + i), N the request's cells (``draw_jobs``, ``all_draws_job``).
    """

    loaded: LoadedModel
    request: GenerationRequest
    cells: pd.DataFrame

    def __len__(self) -> int:
        return len(self.cells)

    def job(
        self, cells: range | None = None, *, draw: int = 0, deadline: float | None = None
    ) -> EngineJob:
        """The engine job for ``cells`` (default all), draw ``draw`` of them (default the first,
        the one every request has)."""
        cells = range(len(self)) if cells is None else cells
        if cells.start < 0 or cells.stop > len(self) or len(cells) == 0:
            raise ValueError(f"cells {cells} must be a non-empty part of the {len(self)} planned.")
        if not 0 <= draw < self.request.n_samples:  # a bug, not a user error
            raise ValueError(f"draw {draw} is not one of the request's {self.request.n_samples}.")
        labels, cell_types = plan_labels(self.loaded, self.cells.iloc[cells.start : cells.stop])
        request, imputed = self.request, self.request.imputation
        return EngineJob(
            num_cells=len(cells),
            sampling=request.sampling,
            first_cell=draw_cell_index(cells.start, draw, len(self)),
            labels=labels,
            cell_types=cell_types,
            x_init=None if imputed is None else imputed.x_init[cells.start : cells.stop],
            fixed=None if imputed is None else imputed.fixed[cells.start : cells.stop],
            deadline=deadline,
            expected=request.expected,
        )

    def jobs(
        self, cells: range | None = None, *, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[tuple[range, EngineJob]]:
        """``batch_size`` cells at a time: (cell numbers, job), built as they are needed."""
        cells = range(len(self)) if cells is None else cells
        if cells.start < 0 or cells.stop > len(self):
            raise ValueError(f"cells {cells} are outside the request's 0..{len(self)} cells.")
        size = batch_size
        for lo in range(cells.start, cells.stop, size):
            batch = range(lo, min(lo + size, cells.stop))
            yield batch, self.job(batch)

    def draw_jobs(
        self, cells: range | None = None, *, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[tuple[range, int, EngineJob]]:
        """Every draw of ``cells``, ``batch_size`` cells at a time: (cell numbers, draw,
        job), a batch's ``n_samples`` draws one after another, draw 0 first, so the mean of one
        batch is complete before the next batch runs. One draw: ``jobs``, draw 0 each."""
        for batch, first in self.jobs(cells, batch_size=batch_size):
            yield batch, 0, first
            for draw in range(1, self.request.n_samples):
                yield batch, draw, self.job(batch, draw=draw)

    def all_draws_job(self, *, deadline: float | None = None) -> EngineJob:
        """Every draw of every cell as one job (the server runs a request as one): row
        j * N + i is draw j of cell i, the rows of ``job(draw=j)`` one after another, on
        streams 0 .. k * N - 1. One draw: ``job()``."""
        whole, draws = self.job(deadline=deadline), self.request.n_samples
        if draws == 1:
            return whole

        def tiled(rows: torch.Tensor | None) -> torch.Tensor | None:  # (N, ...) -> (k * N, ...)
            return None if rows is None else rows.repeat(draws, *([1] * (rows.dim() - 1)))

        return replace(
            whole,
            num_cells=draws * whole.num_cells,
            labels=tiled(whole.labels),
            cell_types=tiled(whole.cell_types),
            x_init=tiled(whole.x_init),
            fixed=tiled(whole.fixed),
        )

    def var(self) -> pd.DataFrame:
        """The output's ``var``: the model's genes, and ``observed`` when imputing."""
        genes = list(self.loaded.config.genes)
        var = pd.DataFrame(index=pd.Index(genes, dtype=object))
        if self.request.imputation is not None:
            var["observed"] = self.request.imputation.observed(genes)
        return var


def plan(loaded: LoadedModel, request: GenerationRequest) -> Plan:
    """The one planning call: ``request`` validated, its names checked against ``loaded`` and
    its cells numbered. Raises ``ValueError`` (``UnknownLabelError`` for an unknown name, with
    close matches) naming the field; ``OptionError`` for a step kind the model cannot take."""
    request.validate()
    check_step_kind(request.sampling, loaded.graph)
    check_expected(request.expected, loaded.graph)
    return Plan(loaded, request, cell_plan(loaded, request))
