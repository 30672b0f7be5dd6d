"""Imputation inputs: observed counts of some genes, as the tokens every reverse step keeps.

Genes are matched by name. Genes the model does not have are dropped and recorded (not an
error: real data often carries extra genes); model genes the data lacks are sampled like every
unobserved count. Counts must be integers (``.X`` or a layer, as ``sedd.io.read.read_counts``
reads them; the server passes them as lists).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anndata
import pandas as pd
import torch

from sedd.checkpoints import LoadedModel
from sedd.io.read import read_counts, require_unique
from sedd.io.tokens import CountMatrix, counts_to_tokens
from sedd.request.conditions import single_condition


class NoKnownGenesError(ValueError):
    """None of the genes given is one of the model's."""


@dataclass(frozen=True, eq=False)
class Imputation:
    """Observed counts of some genes of N cells, as the tokens every step keeps.

    ``x_init`` (N, G) holds the observed tokens and the mask elsewhere; ``fixed`` (N, G) marks
    the observed positions; ``genes`` are the observed genes, as given, and ``dropped_genes``
    those given that the model does not have. ``obs`` (when the input is an AnnData) is its
    ``obs``: the output's cells keep its names and columns. ``cell_types`` (models with cell
    types) gives each cell its own (``with_cell_types``). CPU tensors.
    """

    x_init: torch.Tensor  # (N, G) long
    fixed: torch.Tensor  # (N, G) bool
    genes: tuple[str, ...]
    dropped_genes: tuple[str, ...] = ()
    obs: pd.DataFrame | None = None
    cell_types: tuple[str, ...] | None = None  # one per cell

    @property
    def num_cells(self) -> int:
        return int(self.x_init.shape[0])

    def observed(self, genes: Sequence[str]) -> list[bool]:
        """For each of ``genes`` (the model's), whether its counts were given."""
        given = set(self.genes)
        return [gene in given for gene in genes]


def imputation_from_counts(
    loaded: LoadedModel,
    genes: Sequence[str],
    counts: CountMatrix,
    *,
    clip: bool = False,
    obs: pd.DataFrame | None = None,
    source: str = "the {n} genes",
) -> Imputation:
    """The ``Imputation`` of ``counts`` (N, K) observed for ``genes`` (K names); ``source``
    says where the names came from in the error for none known.

    Genes the model does not have are dropped (``Imputation.dropped_genes``). Raises
    ``NoKnownGenesError`` when none is the model's, ``CountRangeError`` for counts its vocabulary
    cannot hold (unless ``clip``) and ``ValueError`` for a model without a mask (imputation
    needs the absorbing graph).
    """
    cfg = loaded.config
    mask = cfg.tokens.mask_index
    if mask is None:
        raise ValueError("imputation needs an absorbing-graph (masked) model; this one has none.")
    if counts.shape[0] == 0:
        raise ValueError("the data has no cells (0 rows): nothing to impute; pass cells.")
    names = [str(g) for g in genes]
    positions = {gene: i for i, gene in enumerate(cfg.genes)}
    keep = [i for i, gene in enumerate(names) if gene in positions]
    if not keep:
        raise NoKnownGenesError(
            f"none of {source.format(n=len(names))} is one of the model's {len(positions)} genes "
            f"(given e.g. {names[:3]}, the model's e.g. {list(cfg.genes[:3])}); use the model's "
            "gene identifiers (symbols vs Ensembl IDs)."
        )
    observed = [names[i] for i in keep]
    kept = counts[:, keep] if len(keep) < len(names) else counts
    given = counts_to_tokens(kept, cfg.tokens.num_bins, genes=observed, clip=clip)
    columns = torch.tensor([positions[g] for g in observed], dtype=torch.long)
    x_init = torch.full((given.n_cells, cfg.num_genes), mask, dtype=torch.long)  # all masked
    x_init[:, columns] = given.tokens
    fixed = torch.zeros_like(x_init, dtype=torch.bool)
    fixed[:, columns] = True
    dropped = tuple(gene for gene in names if gene not in positions)
    if obs is not None and len(obs) != given.n_cells:  # a bug, not a user error
        raise ValueError(f"obs has {len(obs)} rows for {given.n_cells} cells.")
    return Imputation(x_init, fixed, tuple(observed), dropped, obs)


def imputation_from_anndata(
    loaded: LoadedModel,
    data: anndata.AnnData | str | Path,
    *,
    layer: str | None = None,
    clip: bool = False,
) -> Imputation:
    """Read integer counts from ``data`` (``.X`` or ``layer``); genes matched by var_names;
    the output keeps its cells' names and obs columns."""
    adata = read_counts(data, layer=layer)
    names = [str(g) for g in adata.var_names]
    require_unique(names, "the data's var_names")
    return imputation_from_counts(
        loaded, names, adata.X, clip=clip, obs=adata.obs,
        source="the data's {n} genes (var_names)",
    )  # fmt: skip


def dropped_genes_warning(imputation: Imputation) -> None:
    """Warn (``UserWarning``, shown once by the CLI) about the genes the model does not have."""
    dropped = imputation.dropped_genes
    if dropped:
        warnings.warn(
            f"{len(dropped)} gene(s) of the data are not in the model and were dropped "
            f"(e.g. {', '.join(dropped[:5])}).",
            UserWarning,
            stacklevel=3,
        )


def label_runs(labels: Sequence[str]) -> tuple[list[str], list[int]]:
    """Per-cell labels as runs: (names, counts), e.g. A A B A -> ([A, B, A], [2, 1, 1]), the
    form a request takes one condition per cell in (``GenerationRequest.condition_counts``)."""
    names: list[str] = []
    counts: list[int] = []
    for label in labels:
        if names and names[-1] == label:
            counts[-1] += 1
        else:
            names.append(str(label))
            counts.append(1)
    return names, counts


class ImputationConditionNote(UserWarning):
    """Which obs column the imputed cells' conditions came from, when none was named."""


def imputation_conditions(
    loaded: LoadedModel,
    imputation: Imputation,
    condition: str | None = None,
    condition_key: str | None = None,
) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
    """(conditions, condition_counts) for a request imputing ``imputation``'s cells.

    ``condition``: one condition for every cell. ``condition_key``: an obs column of the input
    giving each cell its own. Neither: the model's training key (``label_key``) when the input
    has that column (with an ``ImputationConditionNote`` saying so), else the control.
    """
    if condition is not None and condition_key is not None:
        raise ValueError(
            f"pass `condition` ({condition!r}) or `condition_key` ({condition_key!r}), not both."
        )
    obs = imputation.obs
    key = condition_key
    if key is None and condition is None and loaded.conditional and obs is not None:
        training_key = loaded.config.label_key
        if training_key is not None and training_key in obs.columns:
            key = training_key
            warnings.warn(
                f"imputing each cell under its own {key!r} label (the model's training key); "
                "pass condition=NAME (--condition) for one condition for all.",
                ImputationConditionNote,
                stacklevel=3,
            )
    if key is None:
        return single_condition(loaded, condition), None
    if not loaded.conditional:
        raise ValueError(
            f"`condition_key` must be left out: this model is unconditional, got {key!r}."
        )
    labels = _obs_labels(obs, "condition_key", key, "label", "condition")
    names, counts = label_runs(labels)
    return tuple(names), tuple(counts)


def _obs_labels(
    obs: pd.DataFrame | None, field: str, key: str, what: str, single: str
) -> list[str]:
    """Each cell's value in the input's obs column ``key`` (named by the argument ``field``),
    as text; a missing column or a cell without a value is a ValueError saying what to pass
    (``single``: the argument that gives one value for all cells)."""
    if obs is None or key not in obs.columns:
        columns = [] if obs is None else [str(c) for c in obs.columns]
        raise ValueError(
            f"`{field}` {key!r} is not a column of the data's obs (columns: "
            f"{', '.join(columns[:10]) or 'none'}); pass one of them."
        )
    column = obs[key]
    if column.isna().any():
        first = str(obs.index[column.isna().to_numpy()][0])
        raise ValueError(
            f"`{field}` {key!r} has no {what} for cell {first!r}; fill it or pass `{single}` "
            f"for one {single.replace('_', ' ')} for all."
        )
    return [str(v) for v in column]


def with_cell_types(
    loaded: LoadedModel,
    imputation: Imputation,
    cell_types: Sequence[str] | None = None,
    cell_type_key: str | None = None,
) -> Imputation:
    """``imputation`` with a cell type per cell: ``cell_types`` (one per cell, as the server
    takes them) or the input's obs column ``cell_type_key``. Unknown names raise
    ``UnknownLabelError`` with suggestions."""
    if cell_types is None and cell_type_key is None:
        return imputation
    if not loaded.config.cell_types:
        field = "cell_type_key" if cell_type_key is not None else "cell_types"
        raise ValueError(f"`{field}` must be left out: this model has no cell types.")
    if cell_type_key is not None:
        cell_types = _obs_labels(imputation.obs, "cell_type_key", cell_type_key, "cell type",
                                 "cell_type")  # fmt: skip
    names = tuple(cell_types or ())
    if len(names) != imputation.num_cells:
        raise ValueError(
            f"`cell_types` names {len(names)} cell types for {imputation.num_cells} cells: "
            "give one per cell."
        )
    for name in dict.fromkeys(names):
        loaded.cell_type_index(name)  # raises UnknownLabelError with suggestions
    return replace(imputation, cell_types=names)
