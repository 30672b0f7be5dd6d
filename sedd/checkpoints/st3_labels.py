"""Label names an st3-style experiment gives itself (args.json's ``cell_type_to_idx``,
``cell_types`` and ``perturbations``), and the checks that keep a name list from reordering what
training used: a list beside args.json's own list must agree with it, and a list is refused
where training read an index file that is not here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sedd.checkpoints.io import CheckpointError
from sedd.checkpoints.label_files import label_file_kind
from sedd.checkpoints.labels import names_from_mapping, read_label_mapping
from sedd.checkpoints.schema import ST3Arch, ST3PerturbationArch


def index_file_needed(
    args: dict[str, Any],
    arch: ST3PerturbationArch,
    found: Path | None,
    listed: str | Path | None,
    args_file: Path,
) -> None:
    """Training read its labels from an index file (args.json names ``cond_labels_pt_path``
    and the model takes no vectors) that is not here: a name list's order cannot be proven to
    match it, so a list is refused rather than trusted."""
    named = args.get("cond_labels_pt_path")
    if not named or found is not None or arch.precomputed_emb_dim or listed is None:
        return
    if label_file_kind(listed) == "names":
        raise CheckpointError(
            f"{args_file} says training took its label indices from {named} ({{name: index}}), "
            f"which is not here; the order of the name list {listed} cannot be proven to match "
            "it. Pass that file (st3 scripts: --cond_labels_pt_path or --perturbations_all_file; "
            "sedd: --perturbation-map)."
        )


def same_order(
    listed: str | Path, trained: list[str], arch: ST3PerturbationArch, args_file: Path
) -> None:
    """A name list given beside args.json's own ``perturbations`` must agree with it: the
    args.json list is the training order, and a name may never move to another index."""
    given = read_label_mapping(listed, arch.num_perturbations)
    moved = [(n, given.index(n), i) for i, n in enumerate(trained) if n in given
             and given.index(n) != i]  # fmt: skip
    if moved or set(given) != set(trained):
        detail = (f"{moved[0][0]!r} is index {moved[0][1]} there, {moved[0][2]} in training"
                  if moved else "they name different perturbations")  # fmt: skip
        raise CheckpointError(
            f"{listed} disagrees with the perturbations {args_file} lists in training order "
            f"({detail}); leave the perturbation list out, args.json names them."
        )


@dataclass(frozen=True)
class LabelNames:
    """Label names by index that ``args.json`` itself gives (None: it gives none)."""

    perturbations: list[str] | None = None
    cell_types: list[str] | None = None


def label_names(
    args: dict[str, Any], arch: ST3Arch | ST3PerturbationArch, args_file: Path
) -> LabelNames:
    """Cell types from ``cell_type_to_idx`` ({name: index}: st3, aivc-dcm) or ``cell_types``;
    perturbations from ``perturbations`` (lists in index order: st3's cell-type trainer)."""
    if not isinstance(arch, ST3PerturbationArch):
        return LabelNames()
    cell_types = None
    if arch.num_cell_types:
        mapping = args.get("cell_type_to_idx") or None
        if mapping is not None:
            cell_types = names_from_mapping(mapping, arch.num_cell_types, args_file, "cell type")
        else:
            cell_types = listed_names(args, "cell_types", arch.num_cell_types, args_file)
    perturbations = listed_names(args, "perturbations", arch.num_perturbations, args_file)
    return LabelNames(perturbations, cell_types)


def listed_names(
    args: dict[str, Any], key: str, expected: int, args_file: Path
) -> list[str] | None:
    """``args[key]``: a list naming the model's ``expected`` labels once each, entry i naming
    index i (as st3's cell-type inference numbers them); None when absent."""
    names = args.get(key)
    if names is None:
        return None
    listed = [str(name) for name in names] if isinstance(names, list) else []
    if len(listed) != expected or len(set(listed)) != len(listed):
        found = (
            f"{len(listed)} names, {len(set(listed))} distinct"
            if isinstance(names, list)
            else f"a {type(names).__name__}"
        )
        raise CheckpointError(
            f"{args_file}: {key} must list the model's {expected} names once each, in index "
            f"order; found {found}. Fix {key} in {args_file.name}."
        )
    return listed
