"""What a model can sample: ``ModelLimits`` and the one check of a request's rows against them.

The engine checks each job here before it is queued (``sedd.engine.jobs.validate_job``), and
st3's sampler classes check their arguments here before the reference loop runs, so both refuse
the same inputs with the same message: the field, its value and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sedd.diffusion.graph import Graph
from sedd.diffusion.randomness import MAX_CELLS


@dataclass(frozen=True)
class ModelLimits:
    """What ``check_inputs`` checks rows against. ``None``: not known, so not checked (a bare
    score module sampled through ``sedd.diffusion.st3_samplers``)."""

    num_genes: int | None
    num_perturbations: int | None = None  # 0: unconditional
    label_dim: int | None = None  # length of precomputed perturbation vectors, if taken
    num_cell_types: int | None = None

    @classmethod
    def of_model(cls, loaded: Any) -> ModelLimits:
        """From a loaded checkpoint's config (``sedd.checkpoints.LoadedModel``)."""
        cfg = loaded.config
        return cls(
            num_genes=cfg.num_genes,
            num_perturbations=cfg.num_perturbations,
            label_dim=getattr(cfg.arch, "precomputed_emb_dim", None),
            num_cell_types=cfg.num_cell_types,
        )

    @classmethod
    def of_module(cls, model: object, num_genes: int | None = None) -> ModelLimits:
        """Limits read from a module's attributes (st3's modules carry them), where present."""
        return cls(
            num_genes=num_genes if num_genes is not None else getattr(model, "num_genes", None),
            num_perturbations=getattr(model, "num_perturbations", None),
            label_dim=getattr(model, "precomputed_emb_dim", None),
            num_cell_types=getattr(model, "num_cell_types", None),
        )


def _bad(name: str, rule: str, value: object) -> ValueError:
    return ValueError(f"`{name}` must be {rule}, got {value}.")


def _span(values: torch.Tensor) -> str:
    return f"values in [{int(values.min())}, {int(values.max())}]"


def check_inputs(
    limits: ModelLimits,
    graph: Graph,
    *,
    num_cells: int,
    first_cell: int,
    eps: float,
    labels: torch.Tensor | None,
    cell_types: torch.Tensor | None,
    x_init: torch.Tensor | None,
    fixed: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the field and value unless the model can run these rows
    (the sampling options check themselves: ``sedd.defaults.SamplingOptions``).

    Label indices are range-checked here: an out-of-range embedding index on CUDA is a
    device-side assert that would take the whole engine down, not just this request.
    """
    n = num_cells
    values = {"num_cells": n, "first_cell": first_cell, "eps": eps}
    for name, ok, rule in (
        ("num_cells", n >= 1, ">= 1"),
        ("first_cell", 0 <= first_cell <= MAX_CELLS - n, "in [0, 2**48 - num_cells]"),
        ("eps", 0.0 < eps < 1.0, "in (0, 1)"),
    ):
        if not ok:
            raise _bad(name, rule, values[name])
    _check_labels(labels, cell_types, limits, n)
    if x_init is None and limits.num_genes is None:
        raise _bad("x_init", "given, or the number of genes known", None)
    _check_imputation(x_init, fixed, graph, n, limits.num_genes)


def _check_labels(
    labels: torch.Tensor | None, cell_types: torch.Tensor | None, limits: ModelLimits, n: int
) -> None:
    perts = limits.num_perturbations
    if labels is None and perts:
        raise _bad("labels", "given: this model is conditioned on perturbations", None)
    if labels is not None and perts == 0:
        raise _bad("labels", "None: this model is unconditional", tuple(labels.shape))
    if labels is not None and labels.is_floating_point():
        dim = limits.label_dim
        shape_ok = labels.shape == (n, dim) if dim is not None else labels.ndim == 2
        if not shape_ok or labels.shape[0] != n or not bool(torch.isfinite(labels).all()):
            raise _bad("labels", f"finite vectors of shape ({n}, {dim})", tuple(labels.shape))
    elif labels is not None:
        if labels.shape != (n,):
            raise _bad("labels", f"of shape ({n},)", tuple(labels.shape))
        if labels.min() < 0 or (perts is not None and labels.max() >= perts):
            raise _bad("labels", f"indices in [0, {perts})", _span(labels))
    if cell_types is not None:
        if cell_types.shape != (n,) or cell_types.is_floating_point():
            raise _bad("cell_types", f"integer indices of shape ({n},)", tuple(cell_types.shape))
        kinds = limits.num_cell_types
        if cell_types.min() < 0 or (kinds is not None and cell_types.max() >= kinds):
            raise _bad("cell_types", f"indices in [0, {kinds})", _span(cell_types))


def _check_imputation(
    x: torch.Tensor | None, fixed: torch.Tensor | None, graph: Graph, n: int, g: int | None
) -> None:
    vocab = graph.dim
    if fixed is not None and x is None:
        raise _bad("x_init", "given when `fixed` is", None)
    if x is None:
        return
    g = x.shape[1] if g is None and x.ndim == 2 else g
    if x.shape != (n, g) or x.is_floating_point():
        raise _bad("x_init", f"integer tokens of shape ({n}, {g})", tuple(x.shape))
    if x.min() < 0 or x.max() >= vocab:
        raise _bad("x_init", f"tokens in [0, {vocab})", _span(x))
    if fixed is None:
        return
    if fixed.shape != (n, g) or fixed.dtype != torch.bool:
        raise _bad(
            "fixed", f"a bool tensor of shape ({n}, {g})", f"{fixed.dtype} {tuple(fixed.shape)}"
        )
    mask = graph.mask_index
    if mask is not None and bool((x[fixed] == mask).any()):
        raise _bad("fixed", "over real tokens, never the mask", "a fixed masked position")
