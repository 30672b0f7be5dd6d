"""Which upstream class an st3-style experiment was trained as, read from what it says: args.json's
``model_name`` (aivc-dcm, the DCM paper's release), else its ``model_size`` (st3's cell-type
trainer), else ``celltype_*`` weight names; never a fallback. An unknown class is refused.
``with_st3_names`` puts st3's cell-type family's weights under the summed model's names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from sedd.checkpoints.io import CheckpointError

Family = Literal["st3", "st3_perturbation", "separate_film", "cell_type"]

# The upstream classes we can build: a family, then optionally a size (which sets only upstream's
# default dimensions; args.json and the tensor shapes give the real ones).
_UPSTREAM_CLASS = re.compile(
    r"(?P<family>SEDDTransformer|SEDDPerturbationTransformer(?:SeparateFiLM)?"
    r"|SEDDCellTypePerturbationTransformer)(?:Small|Medium|Large)?"
)
_KNOWN_CLASSES = (
    "SEDDTransformer, SEDDPerturbationTransformer, SEDDPerturbationTransformerSeparateFiLM, "
    "SEDDCellTypePerturbationTransformer, each alone or + Small, Medium or Large"
)
_CELL_TYPE_SIZES = ("small", "medium", "large")  # st3's cell-type trainer's --model_size
# st3's cell-type family names its weights its own way; the network is st3's summed model
_CELL_TYPE_RENAMES = (
    ("celltype_embed.", "cell_type_embed."),
    ("celltype_proj.", "cell_type_proj."),
    ("precomputed_pert_proj.", "precomputed_proj."),
)


@dataclass(frozen=True)
class UpstreamClass:
    """The class an experiment was trained as (``SEDDPerturbationTransformerSeparateFiLMSmall``,
    say): a name ``_UPSTREAM_CLASS`` matches."""

    name: str

    @property
    def family(self) -> Family:
        found = _UPSTREAM_CLASS.fullmatch(self.name)
        match found.group("family") if found else None:
            case "SEDDTransformer":
                return "st3"
            case "SEDDPerturbationTransformer":
                return "st3_perturbation"
            case "SEDDPerturbationTransformerSeparateFiLM":
                return "separate_film"
            case "SEDDCellTypePerturbationTransformer":
                return "cell_type"
            case _:
                raise ValueError(f"{self.name!r} is not an upstream class sedd can build.")


def upstream_class(
    args: dict[str, Any], state: dict[str, torch.Tensor], args_file: Path
) -> UpstreamClass | None:
    """What the experiment says it is: args.json's ``model_name`` (aivc-dcm), else its
    ``model_size`` (st3's cell-type trainer), else ``celltype_*`` weights; None for st3's own
    experiments, which name no class."""
    name = args.get("model_name")
    if name is not None:
        if not isinstance(name, str) or not _UPSTREAM_CLASS.fullmatch(name):
            raise CheckpointError(
                f"{args_file} asks for model_name {name!r}, which sedd cannot build; known: "
                f"{_KNOWN_CLASSES}. Fix model_name to the class the weights were trained as."
            )
        return UpstreamClass(name)
    size = args.get("model_size")
    if size is not None:
        if size not in _CELL_TYPE_SIZES:
            raise CheckpointError(
                f"{args_file} asks for model_size {size!r}, which st3's cell-type trainer does "
                f"not write; known: {', '.join(_CELL_TYPE_SIZES)}. Fix model_size."
            )
        return UpstreamClass(f"SEDDCellTypePerturbationTransformer{size.capitalize()}")
    if any(key.startswith(("celltype_embed.", "celltype_proj.")) for key in state):
        return UpstreamClass("SEDDCellTypePerturbationTransformer")
    return None


def with_st3_names(
    state: dict[str, torch.Tensor], upstream: UpstreamClass | None, weights: Path
) -> dict[str, torch.Tensor]:
    """The weights under our names: st3's cell-type family renamed, the rest as they are."""
    if upstream is None or upstream.family != "cell_type":
        return state
    if any(key.startswith("precomputed_celltype_proj.") for key in state):
        raise CheckpointError(
            f"{weights} holds precomputed_celltype_proj: its cell types were trained as vectors "
            "(st3's --celltype_labels_pt_path), and sedd gives cell types by index only; use a "
            "model trained with cell-type indices."
        )
    renamed = {}
    for key, value in state.items():
        for old, new in _CELL_TYPE_RENAMES:
            if key.startswith(old):
                key = new + key.removeprefix(old)
                break
        renamed[key] = value
    return renamed
