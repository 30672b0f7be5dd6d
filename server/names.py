"""The model's names in a body, checked by the library's rules, each error a ``FieldError``
naming the field: what ``server.intake`` needs beyond the body to make its request.

The rules are the library's (``sedd.request.conditions``, ``sedd.request.imputation``), so a
request numbers and conditions its cells as the Python API and ``sedd generate`` do.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from sedd.checkpoints import LoadedModel, UnknownLabelError
from sedd.io.tokens import CountClipWarning, CountRangeError
from sedd.request.conditions import mix_counts, perturbation_conditions, single_condition
from sedd.request.imputation import (
    Imputation,
    NoKnownGenesError,
    imputation_from_counts,
    label_runs,
    with_cell_types,
)
from server.errors import FieldError


def one_condition(loaded: LoadedModel, given: str | None) -> tuple[str, ...] | None:
    """The single condition of /generate and /impute: the control when none is given."""
    try:
        return single_condition(loaded, given)
    except ValueError as err:
        raise FieldError(["body", "condition"], str(err), input=given) from None


def cell_conditions(loaded: LoadedModel, names: Sequence[str]) -> tuple[list[str], list[int]]:
    """One condition per cell, checked, as the runs a request takes (``label_runs``)."""
    if not loaded.conditional:
        raise FieldError(
            ["body", "cell_conditions"],
            "this model is unconditional: leave out `cell_conditions`",
            input=list(names[:5]),
        )
    first: dict[str, int] = {}  # each name's first cell
    for i, name in enumerate(names):
        first.setdefault(name, i)
    for name, i in first.items():
        try:
            loaded.perturbation_labels([name])
        except UnknownLabelError as err:
            raise FieldError(
                ["body", "cell_conditions", i],
                str(err),
                type=f"unknown_{err.kind.replace(' ', '_')}",
                input=name,
                ctx={"suggestions": err.suggestions},
            ) from None
    return label_runs(names)


def mix(loaded: LoadedModel, counts: Mapping[str, int]) -> tuple[list[str], list[int]]:
    """A label mix ``{name: cells}`` in the model's order (``mix_counts``), as
    ``Model.generate(like=...)`` orders it."""
    try:
        return mix_counts(loaded, counts)
    except UnknownLabelError as err:
        raise FieldError(
            ["body", "conditions", err.name],
            str(err),
            type=f"unknown_{err.kind.replace(' ', '_')}",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None
    except ValueError as err:  # an unconditional model
        raise FieldError(["body", "conditions"], str(err), input=dict(counts)) from None


def cell_types(loaded: LoadedModel, imputation: Imputation, names: Sequence[str]) -> Imputation:
    """``imputation`` with a cell type per cell, checked (``with_cell_types``)."""
    try:
        return with_cell_types(loaded, imputation, cell_types=names)
    except UnknownLabelError as err:
        raise FieldError(
            ["body", "cell_types", list(names).index(err.name)],
            str(err),
            type="unknown_cell_type",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None
    except ValueError as err:  # a model without cell types
        raise FieldError(["body", "cell_types"], str(err), input=list(names[:5])) from None


def predicted_conditions(
    loaded: LoadedModel, perturbations: Sequence[str], include_control: bool
) -> tuple[str, ...]:
    """The library's rule (``perturbation_conditions``: control first, duplicates dropped), so
    a /predict request numbers its cells as ``sedd predict`` and ``Model.predict`` do."""
    if not loaded.conditional:
        raise FieldError(
            ["body", "perturbations"],
            "this model is unconditional: it has no perturbations to predict; use /generate",
            input=list(perturbations),
        )
    if include_control and loaded.config.control_label is None:
        raise FieldError(
            ["body", "include_control"],
            "this model has no control label; set `include_control` to false",
            input=True,
        )
    try:
        names = perturbation_conditions(loaded, perturbations, include_control=include_control)
    except UnknownLabelError as err:
        at = perturbations.index(err.name) if err.name in perturbations else None
        raise FieldError(
            ["body", "perturbations"] + ([] if at is None else [at]),
            str(err),
            type=f"unknown_{err.kind.replace(' ', '_')}",
            input=err.name,
            ctx={"suggestions": err.suggestions},
        ) from None
    except ValueError as err:  # only the control was listed, and include_control removes it
        raise FieldError(["body", "include_control"], str(err), input=False) from None
    return tuple(names)


def imputation(
    loaded: LoadedModel, genes: Sequence[str], counts: Sequence[Sequence[int]], clip: bool
) -> Imputation:
    """The library's imputation of a body's counts: genes the model does not have are dropped
    and reported, as ``sedd impute`` does."""
    try:
        with warnings.catch_warnings():  # the client asked for clipping: no server log line
            warnings.simplefilter("ignore", CountClipWarning)
            matrix = np.asarray(counts, dtype=np.int64)
            return imputation_from_counts(loaded, genes, matrix, clip=clip)
    except NoKnownGenesError as err:
        raise FieldError(
            ["body", "genes"],
            f"{err} GET /v1/models lists them.",
            type="unknown_gene",
            input=list(genes[:5]),
        ) from None
    except CountRangeError as err:
        raise FieldError(
            ["body", "counts"],
            str(err),
            type="count_out_of_range",
            ctx={"max_count": loaded.config.tokens.max_count},
        ) from None
    except ValueError as err:  # a model without a mask
        raise FieldError(["body", "genes"], str(err), input=None) from None
