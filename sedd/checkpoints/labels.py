"""Side files that name a model's genes and labels, for every source format.

Checkpoints often store no names: st3 keeps gene names out of its experiments, and label
embeddings are rows by index. These readers take the names from side files:

* ``read_gene_list``: gene names in model order, a text file (one a line), a JSON file (a list
  of names, or ``{name: index}``) or an h5ad's ``var_names``;
* ``read_label_mapping``: label names by index, from JSON (``{name: index}`` or ``[names]``),
  text (line i names index i, st3's ``perturbation_names_all.txt``) or a ``.pt`` file;
* ``read_vectors``: perturbation vectors (e.g. ESM2), a ``{name: tensor}`` file.

``with_label_files`` applies them to the parts a layout reader returned (``SourceParts``), and
notes what stays unnamed. ``names_from_mapping`` turns a ``{name: index}`` mapping into names by
index (st3's ``cell_type_to_idx``, say).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from sedd.checkpoints.io import CheckpointError, read_safetensors, read_torch_file, require_file
from sedd.checkpoints.label_files import (
    index_map_names,
    label_file_kind,
    read_mapping_file,
    reject_duplicate_keys,
)
from sedd.checkpoints.loaded import SourceParts
from sedd.checkpoints.schema import ModelConfig

__all__ = [
    "index_map_names",
    "label_file_kind",
    "names_from_mapping",
    "read_gene_list",
    "read_label_mapping",
    "read_vectors",
    "with_label_files",
]


_GENE_LIST_FIX = "pass the gene list the model was trained on, in training order"


def read_gene_list(path: str | Path, num_genes: int, *, fix: str = _GENE_LIST_FIX) -> list[str]:
    """Gene names in model order: a text file (one a line), JSON (a list of names, or
    ``{name: index}``) or an h5ad's ``var_names``. ``fix`` ends the errors: what to do."""
    path = require_file(Path(path), "gene list")
    if path.suffix == ".h5ad":
        # slow to import (anndata); only h5ad gene lists need it
        from sedd.io.hdf5_safety import ExternalDataError, NotHdf5Error
        from sedd.io.read import read_h5ad_safely

        try:
            adata = read_h5ad_safely(path, what="gene list", backed="r")
        except (ExternalDataError, NotHdf5Error) as err:  # one line: the file, what to do
            raise CheckpointError(str(err)) from None
        except Exception as err:  # h5py / anndata raise many types on bad files
            raise CheckpointError(f"cannot read {path} as h5ad ({err}); pass a text list.") from err
        names = [str(n) for n in adata.var_names]
        adata.file.close()
    elif path.suffix == ".json":
        names = _json_gene_names(path, num_genes, fix)
    else:
        try:
            names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise CheckpointError(f"{path} is not a text gene list (one name a line).") from None
    if len(names) != num_genes:
        raise CheckpointError(
            f"gene list {path} has {len(names)} names but the model has {num_genes} genes; {fix}."
        )
    repeated = [name for name, n in Counter(names).items() if n > 1]
    if repeated:
        raise CheckpointError(
            f"gene list {path} names genes more than once: {repeated[:10]}; make them unique "
            "(e.g. anndata's var_names_make_unique) before converting."
        )
    return names


def _json_gene_names(path: Path, num_genes: int, fix: str) -> list[str]:
    """A JSON list of names (entry i names gene i), or ``{name: index}``."""
    try:
        data = json.loads(path.read_text(), object_pairs_hook=reject_duplicate_keys)
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not a JSON text file; {fix}.") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); {fix}.") from None
    except ValueError as err:  # a key given twice (reject_duplicate_keys)
        raise CheckpointError(f"{path}: gene {err}; each gene must appear once.") from None
    if isinstance(data, list) and all(isinstance(name, str) for name in data):
        return data
    if isinstance(data, dict) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in data.values()
    ):
        if len(data) != num_genes:
            return list(data)  # read_gene_list's count check names both counts
        return names_from_mapping(data, num_genes, path, "gene")
    if isinstance(data, list):
        bad = next(i for i, name in enumerate(data) if not isinstance(name, str))
        found = f"entry {bad} is {data[bad]!r}, not a name"
    elif isinstance(data, dict):
        found = f"an object whose values are not all indices (keys {list(data)[:3]})"
    else:
        found = f"a JSON {type(data).__name__}"
    raise CheckpointError(
        f"{path} must hold a JSON list of gene names in model order, or {{name: index}}; "
        f"found {found}; {fix}."
    )


def names_from_mapping(mapping: Any, expected: int, file: Path, kind: str) -> list[str]:
    """{name: index} -> names by index; must be a bijection onto 0..expected-1."""
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in mapping.items()
    ):
        raise CheckpointError(f"{file}: the {kind} mapping must map names to integer indices.")
    by_index: dict[int, list[str]] = {}
    for name, index in mapping.items():
        by_index.setdefault(index, []).append(name)
    shared = {i: names for i, names in sorted(by_index.items()) if len(names) > 1}
    if shared:
        raise CheckpointError(
            f"{file}: the {kind} mapping gives one index to several names "
            f"({'; '.join(f'{i}: {n}' for i, n in list(shared.items())[:5])}); each index "
            "must name exactly one label."
        )
    skipped = [i for i in range(expected) if i not in by_index]
    extra = sorted(i for i in by_index if not 0 <= i < expected)
    if skipped or extra:
        raise CheckpointError(
            f"{file}: the {kind} mapping must use indices 0..{expected - 1} (the model has "
            f"{expected} {kind} rows) once each; skipped: {skipped[:10]}, out of range: "
            f"{extra[:10]}. Pass the mapping used in training."
        )
    return [by_index[i][0] for i in range(expected)]


def _names_from_list(names: list[Any], expected: int, file: Path, kind: str) -> list[str]:
    names = [str(n) for n in names]
    repeated = [name for name, n in Counter(names).items() if n > 1]
    if repeated:
        raise CheckpointError(
            f"{file}: {kind} names listed more than once: {repeated[:10]}; each label must "
            "appear once (line i names index i)."
        )
    if len(names) != expected:
        raise CheckpointError(
            f"{file} lists {len(names)} {kind} names but the model has {expected} {kind} rows; "
            "pass the mapping used in training."
        )
    return names


def read_label_mapping(
    path: str | Path, expected: int, kind: str = "perturbation", control: str | None = None
) -> list[str | None]:
    """Names by index (``None`` for an index no name uses).

    - ``{name: index}`` (JSON or ``.pt``; DCM's scalar label files, -1 = absent): the indices as
      given; gaps are allowed, two names on one index are not;
    - a list (JSON, ``.pt``, or text: one name a line): line i names index i. st3's scripts read
      such a list as "the control is index 0, the others follow in order", which agrees only
      when the control comes first; with ``control`` given and listed elsewhere the list is
      refused, since no order can be proven to match training.
    """
    path = require_file(Path(path), f"{kind} mapping")
    mapping = read_mapping_file(path)
    if isinstance(mapping, list | tuple):
        names = _names_from_list(list(mapping), expected, path, kind)
        if control is not None and control in names and names[0] != control:
            raise CheckpointError(
                f"{path} lists the control {control!r} on line {names.index(control) + 1}, not "
                f"first: st3 gives the control index 0 and the others the next indices in list "
                f"order, so each name's index is ambiguous. Put {control!r} first if training "
                "did, or pass the {name: index} file training used (DCM: its cond_labels_pt_path)."
            )
        return list(names)
    if (
        isinstance(mapping, dict)
        and mapping
        and all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in mapping.values())
    ):
        raise CheckpointError(
            f"{path} maps names to vectors, not to label indices: pass it as the model's "
            "perturbation vectors (--vectors; st3 scripts: --cond_labels_pt_path)."
        )
    if not isinstance(mapping, dict) or not mapping:
        raise CheckpointError(
            f"{path} must hold {kind} names by index: a list (line i names index i) or a "
            f"{{name: index}} mapping, found {type(mapping).__name__}."
        )
    return index_map_names(mapping, expected, path, kind)


def read_vectors(path: str | Path, dim: int) -> dict[str, torch.Tensor]:
    """A ``{name: (dim,) tensor}`` file (.pt via weights_only, or .safetensors), as fp32."""
    path = require_file(Path(path), "perturbation vector file")
    if path.suffix == ".safetensors":
        data: Any = read_safetensors(path)[0]
    else:
        data = read_torch_file(path)
    if not isinstance(data, dict) or not data:
        raise CheckpointError(f"{path} must hold a non-empty {{name: tensor}} dict of vectors.")
    vectors = {}
    for name, vec in data.items():
        if not isinstance(vec, torch.Tensor) or vec.dim() != 1 or vec.shape[0] != dim:
            found = tuple(vec.shape) if isinstance(vec, torch.Tensor) else type(vec).__name__
            raise CheckpointError(
                f"{path}: vector {name!r} must have shape ({dim},) to match the model's "
                f"precomputed_proj, found {found}; pass the vectors the model was trained with."
            )
        vectors[str(name)] = vec.detach().float().contiguous()
    return vectors


def with_label_files(
    parts: SourceParts,
    *,
    genes: str | Path | None = None,
    perturbations: str | Path | None = None,
    vectors: str | Path | None = None,
    index_file: str | Path | None = None,
    warn_positional: bool = True,
    genes_beside_checkpoint: bool = False,
) -> SourceParts:
    """Apply side files to ``parts.config``; note (for a warning) what stays unnamed.

    ``index_file``: a ``{name: index}`` file training used (DCM's ``cond_labels_pt_path`` with
    scalar labels). It names the labels and wins over a name list in ``perturbations``, whose
    order is then not used (a note says so where the two disagree). A ``vectors`` file that
    holds indices rather than vectors is taken as the index file.

    ``genes_beside_checkpoint``: ``genes`` was not given but found next to the checkpoint (st3's
    ``genes.json``), so its errors say how to fix or override it. The gene file is recorded in
    ``provenance.genes_file``.
    """
    config = parts.config
    notes = list(parts.notes)
    update: dict[str, Any] = {}
    new_vectors = parts.vectors
    if genes is not None:
        fix = _GENE_LIST_FIX
        if genes_beside_checkpoint:
            fix = (
                f"it sits next to the checkpoint, so it is read as the gene list by default: make "
                f"it list the model's {config.num_genes} genes in training order, or pass "
                "--genes FILE (sedd.load(..., genes=FILE)) to use another list"
            )
        update |= {
            "genes": read_gene_list(genes, config.num_genes, fix=fix),
            "genes_by_position": False,
            "provenance": config.provenance.model_copy(update={"genes_file": str(genes)}),
        }
    vector_dim = getattr(config.arch, "precomputed_emb_dim", None)
    if (perturbations is not None or vectors is not None) and not config.num_perturbations:
        raise CheckpointError(
            f"{parts.weights_file} holds an unconditional model; it takes no perturbation "
            "labels, so leave out --perturbation-map / --vectors."
        )
    if perturbations is not None and label_file_kind(perturbations) == "indices":
        index_file, perturbations = perturbations, None  # an explicit index file wins
    if vectors is not None and label_file_kind(vectors) == "indices":
        index_file, vectors = index_file or vectors, None  # DCM: scalar conditional labels
    if vectors is not None:
        if not vector_dim:
            raise CheckpointError(
                f"{parts.weights_file} has no precomputed_proj, so it cannot take perturbation "
                f"vectors; leave out --vectors {vectors}."
            )
        new_vectors = read_vectors(vectors, vector_dim)
        update["perturbation_vectors"] = True
    if index_file is not None:
        update["perturbations"] = read_label_mapping(index_file, config.num_perturbations)
        update["provenance"] = update.get("provenance", config.provenance).model_copy(
            update={"labels_file": str(index_file)}
        )
        if perturbations is not None:
            notes += _list_beside_index_file(
                perturbations, update["perturbations"], index_file, config.control_label
            )
    elif perturbations is not None:
        update["perturbations"] = read_label_mapping(
            perturbations, config.num_perturbations, control=config.control_label
        )
    control = config.control_label
    names = update.get("perturbations", config.perturbations)
    vector_names = list(new_vectors or {})
    if control not in (names or []) and control not in vector_names:
        # st3's convention: label index 0 is the control.
        control = names[0] if names else None
    update["control_label"] = control
    if config.num_perturbations and not names and not vector_names and warn_positional:
        notes.append(
            f"no perturbation names for {parts.weights_file}: labels can be given only by "
            "index. Pass --perturbation-map FILE (JSON {name: index}, or one name a line)."
        )
    new_config = ModelConfig.model_validate(config.model_copy(update=update).model_dump())
    return dataclasses.replace(parts, config=new_config, vectors=new_vectors, notes=notes)


def _list_beside_index_file(
    listed_file: str | Path, names: list[str | None], index_file: str | Path, control: str | None
) -> list[str]:
    """A note when a name list was given beside the index file: its order is not used, and
    where st3's reading of it (control 0, the others in order) would give another index."""
    try:
        data = read_mapping_file(Path(listed_file))
    except (CheckpointError, OSError, UnicodeDecodeError):
        data = None
    if not isinstance(data, list):
        return []
    listed = [str(n) for n in data]
    order = ([control] if control in listed else []) + [n for n in listed if n != control]
    index = {name: i for i, name in enumerate(names) if name is not None}
    moved = [(n, i, index[n]) for i, n in enumerate(order) if n in index and index[n] != i]
    unknown = [n for n in listed if n not in index]
    if not moved and not unknown:
        return []  # the list agrees with the index file: nothing to say
    note = f"{listed_file}: its order is not used; {index_file} gives each name its index"
    if moved:
        name, by_order, by_file = moved[0]
        note += (f" (by list order {name!r} would be index {by_order}, the index file says "
                 f"{by_file}; {len(moved)} names differ)")  # fmt: skip
    if unknown:
        note += f"; not in the index file, so not usable: {unknown[:5]}"
    return [note + "."]


class PositionalGenesWarning(UserWarning):
    """The model's genes have no names: the output's var_names are positions."""


def positional_genes_warning(path: Path, num_genes: int) -> str:
    return (
        f"GENES ARE POSITIONAL: {path} has no gene names, so the cells' var_names are "
        f"'0'..'{num_genes - 1}', not genes; scanpy, cell-eval and any gene lookup will be "
        "wrong. Pass --genes FILE (one name a line, or an .h5ad whose var_names are used; job "
        "scripts: GENES_FILE=FILE; Python: sedd.load(..., genes=FILE))."
    )
