"""Imputation from an AnnData: observed genes matched by name, the others sampled.

Genes the model does not have are reported and dropped (not an error: real data often carries
extra genes); model genes the data lacks are sampled like every unobserved count. The counts
must be integers (``.X`` or a layer, as ``sedd.io.read.read_counts`` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anndata

from sedd.checkpoints import LoadedModel
from sedd.io.read import read_counts, require_unique
from sedd.request.plan import Imputation, imputation_from_counts


@dataclass(frozen=True)
class ImputationInput:
    """The imputation of an AnnData and what was left out of it."""

    imputation: Imputation
    obs_names: list[str]  # the data's cell names, in order
    dropped_genes: list[str]  # in the data but not in the model, in data order

    @property
    def observed_genes(self) -> tuple[str, ...]:
        return self.imputation.genes


def imputation_from_anndata(
    loaded: LoadedModel,
    data: anndata.AnnData | str | Path,
    *,
    layer: str | None = None,
    clip: bool = False,
) -> ImputationInput:
    """Read integer counts from ``data`` (``.X`` or ``layer``) and match genes by name."""
    adata = read_counts(data, layer=layer)
    names = [str(g) for g in adata.var_names]
    require_unique(names, "the data's var_names")
    model_genes = set(loaded.config.genes)
    keep = [i for i, gene in enumerate(names) if gene in model_genes]
    if not keep:
        raise ValueError(
            f"none of the data's {len(names)} genes (e.g. {names[:3]}) is one of the model's "
            f"{len(model_genes)} genes (e.g. {list(loaded.config.genes[:3])}); var_names must use "
            "the model's gene identifiers (symbols vs Ensembl IDs)."
        )
    counts = adata.X[:, keep]
    observed = [names[i] for i in keep]
    imputation = imputation_from_counts(loaded, observed, counts, clip=clip)
    dropped = [gene for gene in names if gene not in model_genes]
    return ImputationInput(imputation, [str(c) for c in adata.obs_names], dropped)
