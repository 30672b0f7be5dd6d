"""Requests and cell plans: what a user asks for, turned into the engine's jobs.

``GenerationRequest`` is the one request type: the Python API, ``sedd generate/predict/impute``,
shard jobs and the server all build one. ``cell_plan`` numbers its cells 0..N-1 (condition by
condition); ``job_for`` turns a range of them into an ``EngineJob`` in which cell i draws from
its own random stream (seed, i), so a cell does not depend on the batch, shard or server request
that ran it. ``imputation_from_counts`` turns observed counts into the tokens imputation keeps.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd
import torch

from sedd.checkpoints import LoadedModel, UnknownLabelError
from sedd.defaults import DEFAULT_GRID, DEFAULT_STEPS, TIME_GRIDS, TimeGrid, resolve_schedule
from sedd.diffusion.sampling import Predictor
from sedd.engine import EngineJob
from sedd.io.tokens import CountMatrix, counts_to_tokens


@dataclass(frozen=True, eq=False)
class Imputation:
    """Observed counts of some genes of N cells, as the tokens every step keeps.

    ``x_init`` (N, G) holds the observed tokens and the mask elsewhere; ``fixed`` (N, G) marks
    the observed positions; ``genes`` are the observed genes, as given. CPU tensors.
    """

    x_init: torch.Tensor  # (N, G) long
    fixed: torch.Tensor  # (N, G) bool
    genes: tuple[str, ...]

    @property
    def num_cells(self) -> int:
        return int(self.x_init.shape[0])


def imputation_from_counts(
    loaded: LoadedModel, genes: Sequence[str], counts: CountMatrix, *, clip: bool = False
) -> Imputation:
    """The ``Imputation`` of ``counts`` (N, K) observed for ``genes`` (K names of the model's).

    Raises ``UnknownLabelError`` (kind "gene", with close matches) for a gene the model does not
    have, ``CountRangeError`` for counts its vocabulary cannot hold (unless ``clip``), and
    ``ValueError`` for a model without a mask (imputation needs the absorbing graph).
    """
    cfg = loaded.config
    mask = cfg.tokens.mask_index
    if mask is None:
        raise ValueError("imputation needs an absorbing-graph (masked) model; this one has none.")
    positions = {gene: i for i, gene in enumerate(cfg.genes)}
    for gene in genes:
        if gene not in positions:
            raise UnknownLabelError(gene, "gene", cfg.genes)
    given = counts_to_tokens(counts, cfg.tokens.num_bins, genes=list(genes), clip=clip)
    columns = torch.tensor([positions[g] for g in genes], dtype=torch.long)
    x_init = torch.full((given.n_cells, cfg.num_genes), mask, dtype=torch.long)  # all masked
    x_init[:, columns] = given.tokens
    fixed = torch.zeros_like(x_init, dtype=torch.bool)
    fixed[:, columns] = True
    return Imputation(x_init, fixed, tuple(str(g) for g in genes))


@dataclass(frozen=True)
class SamplingOptions:
    """How cells are sampled, whatever is asked for (vLLM's ``SamplingParams``): the schedule,
    the reverse step, temperature, the seed and the cells in flight. ``resolve`` is the one
    constructor every front door uses; ``GenerationRequest.of`` takes the result."""

    steps: int = DEFAULT_STEPS
    grid: TimeGrid = DEFAULT_GRID  # sedd.diffusion.sampling.time_grid
    sampler: Predictor = "euler"
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 64

    @classmethod
    def resolve(
        cls,
        steps: int | None = None,
        time_grid: str | None = None,
        *,
        sampler: Predictor = "euler",
        temperature: float = 1.0,
        seed: int = 0,
        batch_size: int = 64,
    ) -> SamplingOptions:
        """Options with the schedule resolved (``sedd.defaults.resolve_schedule``): neither
        ``steps`` nor ``time_grid`` gives the tuned default; ``steps`` alone, st3's uniform grid.
        ``GenerationRequest.validate`` checks the values once, before a run."""
        steps, grid = resolve_schedule(steps, time_grid)
        return cls(steps, grid, sampler, temperature, seed, batch_size)  # type: ignore[arg-type]


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate: the one request type of the API, the CLI, shard jobs and the server.

    ``conditions`` are perturbation names (conditional models only); a name listed k times gets
    k x ``cells_per_condition`` cells. ``imputation`` (one condition only) holds observed counts
    that every cell keeps; its cells are its rows. ``batch_size`` is the number of cells per
    model forward (rounded up to whole forward blocks); it never changes a cell.
    """

    cells_per_condition: int
    conditions: tuple[str, ...] | None = None
    cell_type: str | None = None
    steps: int = DEFAULT_STEPS
    grid: TimeGrid = DEFAULT_GRID  # sedd.diffusion.sampling.time_grid
    sampler: Predictor = "euler"
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 64
    # tokens per model forward; its rows (this // genes) are the forward's fixed shape, so it
    # decides the cells (like the precision). None: the device's default.
    tokens_per_forward: int | None = None
    # replay each forward block from a captured CUDA graph (None: SEDD_CUDA_GRAPHS, else off);
    # never changes a cell, so it is not part of the request's record or identity
    cuda_graphs: bool | None = field(default=None, compare=False)
    imputation: Imputation | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        cells_per_condition: int,
        conditions: Sequence[str] | None,
        cell_type: str | None,
        sampling: SamplingOptions,
        *,
        tokens_per_forward: int | None = None,
        cuda_graphs: bool | None = None,
        imputation: Imputation | None = None,
    ) -> GenerationRequest:
        """The request every front door builds: what to generate, sampled as ``sampling`` says."""
        return cls(
            cells_per_condition=cells_per_condition,
            conditions=tuple(conditions) if conditions else None,
            cell_type=cell_type,
            **asdict(sampling),  # the sampling fields, by name
            tokens_per_forward=tokens_per_forward,
            cuda_graphs=cuda_graphs,
            imputation=imputation,
        )

    @property
    def sampling(self) -> SamplingOptions:
        return SamplingOptions(**{f.name: getattr(self, f.name) for f in fields(SamplingOptions)})

    def validate(self) -> None:
        budget = self.tokens_per_forward
        checks = {
            "cells_per_condition": (self.cells_per_condition >= 1, ">= 1"),
            "steps": (self.steps >= 1, ">= 1"),
            "temperature": (self.temperature > 0, "> 0"),
            "seed": (self.seed >= 0, ">= 0"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "tokens_per_forward": (budget is None or budget >= 1, ">= 1 (or None)"),
        }
        for name, (ok, rule) in checks.items():
            if not ok:
                raise ValueError(f"`{name}` must be {rule}, got {getattr(self, name)}.")
        if self.sampler not in ("euler", "analytic"):
            raise ValueError(f"`sampler` must be 'euler' or 'analytic', got {self.sampler!r}.")
        if self.grid not in TIME_GRIDS:
            grids = ", ".join(TIME_GRIDS)
            raise ValueError(f"`time_grid` must be one of {grids}, got {self.grid!r}.")
        imputed = self.imputation
        if imputed is not None and imputed.num_cells != self.cells_per_condition:
            raise ValueError(
                f"`cells_per_condition` must equal the imputation's {imputed.num_cells} cells, "
                f"got {self.cells_per_condition}."
            )
        if imputed is not None and len(self.conditions or ()) > 1:
            raise ValueError(
                f"`conditions` must name one condition when imputing, got {self.conditions}."
            )

    def record(self) -> dict[str, object]:
        """The request as plain JSON values (provenance, manifests); imputation as its genes."""
        out: dict[str, object] = {
            "cells_per_condition": self.cells_per_condition,
            "conditions": list(self.conditions or []),
            "cell_type": self.cell_type,
            "steps": self.steps,
            "sampler": self.sampler,
            "temperature": self.temperature,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "tokens_per_forward": self.tokens_per_forward,
        }
        if self.grid != "uniform":  # uniform runs keep the identity (run id, shards) they had
            out["time_grid"] = self.grid
        if self.imputation is not None:
            out["imputed_from_genes"] = list(self.imputation.genes)
        return out


def cell_plan(loaded: LoadedModel, request: GenerationRequest) -> pd.DataFrame:
    """One row per cell to generate, in cell order, named ``<run id>-<cell index>``.

    Columns: the label under each of ``config.label_columns`` (conditional models: ``condition``,
    the training key such as ``bulk_labels``, ``perturbation`` for perturbation models),
    ``condition_idx``, ``sample_idx`` (the cell's number within its condition), ``cell_type``
    (when one is given), ``seed`` and ``cell_index``: the cell draws from stream (seed, cell_index).
    """
    known, conditional = loaded.conditions, loaded.conditional
    if conditional and not request.conditions:
        raise ValueError(
            f"this model is conditioned on perturbations: pass `conditions` (known: "
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
    n = request.cells_per_condition
    cell_index = np.arange(n * max(len(conditions), 1))
    plan = pd.DataFrame(index=[f"{run_id(loaded, request)}-{i}" for i in cell_index])
    if conditional:
        names = pd.Series(np.repeat(conditions, n), index=plan.index)
        for column in loaded.config.label_columns:
            plan[column] = names
        plan["condition_idx"] = [known.index(p) if p in known else -1 for p in names]
        # a condition may be listed more than once: number its cells on
        plan["sample_idx"] = names.groupby(names, sort=False).cumcount()
    else:
        plan["sample_idx"] = cell_index
    if request.cell_type is not None:
        plan["cell_type"] = request.cell_type
    plan["seed"] = request.seed
    plan["cell_index"] = cell_index
    return plan


def run_id(loaded: LoadedModel, request: GenerationRequest) -> str:
    """8 hex digits naming a request's cells: the same for the same model and request (its
    batch size and forward block aside, which never change a cell), different for another seed,
    condition list, cell type, sampler setting or imputed input."""
    identity = request.record()
    for key in ("batch_size", "tokens_per_forward"):
        identity.pop(key)
    identity["model_sha256"] = loaded.file_hash
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    if request.imputation is not None:
        digest.update(request.imputation.x_init.numpy().tobytes())
    return digest.hexdigest()[:8]


def plan_labels(
    loaded: LoadedModel, plan: pd.DataFrame, device: torch.device | str | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(perturbation labels, cell-type labels) of a ``cell_plan`` slice, each (N,) or None, on
    ``device`` (default: the model's). The engine takes them on the CPU (``job_for``)."""
    labels = loaded.perturbation_labels(list(plan["condition"])) if "condition" in plan else None
    cell_types = loaded.cell_type_labels(list(plan["cell_type"])) if "cell_type" in plan else None
    if device is None:
        return labels, cell_types
    return (
        None if labels is None else labels.to(device),
        None if cell_types is None else cell_types.to(device),
    )


def job_for(
    loaded: LoadedModel,
    request: GenerationRequest,
    plan: pd.DataFrame,
    cells: range | None = None,
    *,
    deadline: float | None = None,
) -> EngineJob:
    """The engine job for ``cells`` (default all) of ``request``'s ``plan``: cell i draws from
    stream (seed, i), i its number in the whole request."""
    cells = range(len(plan)) if cells is None else cells
    if cells.start < 0 or cells.stop > len(plan) or len(cells) == 0:
        raise ValueError(f"cells {cells} must be a non-empty part of the {len(plan)} planned.")
    labels, cell_types = plan_labels(loaded, plan.iloc[cells.start : cells.stop], "cpu")
    imputed = request.imputation
    return EngineJob(
        num_cells=len(cells),
        steps=request.steps,
        grid=request.grid,
        sampler=request.sampler,
        temperature=request.temperature,
        seed=request.seed,
        first_cell=cells.start,
        labels=labels,
        cell_types=cell_types,
        x_init=None if imputed is None else imputed.x_init[cells.start : cells.stop],
        fixed=None if imputed is None else imputed.fixed[cells.start : cells.stop],
        deadline=deadline,
    )


def jobs_for(
    loaded: LoadedModel, request: GenerationRequest, plan: pd.DataFrame, cells: range
) -> Iterator[tuple[range, EngineJob]]:
    """``request.batch_size`` cells at a time: (cell numbers, job), built as they are needed."""
    for lo in range(cells.start, cells.stop, request.batch_size):
        batch = range(lo, min(lo + request.batch_size, cells.stop))
        yield batch, job_for(loaded, request, plan, batch)
