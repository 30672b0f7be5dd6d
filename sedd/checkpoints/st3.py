"""st3 experiment directories, and the side files that name genes and labels.

An st3 experiment directory holds ``args.json`` (the training arguments) and ``best.pt``,
``final.pt`` and ``epoch_N.pt``, each ``{"model_state_dict": ..., "optimizer_state_dict": ...,
"step", "epoch", "best_loss", "history"}``. Inference picks best > final > highest epoch.
Dimensions missing from ``args.json`` come from tensor shapes. st3 stores no gene names, so a
gene list is a side file; perturbation names come from ``perturbation_names_all.txt`` (line i
names index i, control = 0) or a mapping file; cell types from ``args.json``'s
``cell_type_to_idx``; perturbation vectors (e.g. ESM2) from a ``{name: tensor}`` file.

The side-file readers here (``read_gene_list``, ``read_label_mapping``, ``read_vectors``) accept
these conventions for every source format (``with_label_files``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from sedd.checkpoints.io import (
    CheckpointError,
    read_json,
    read_safetensors,
    read_torch_file,
    require_file,
    strip_wrapper_prefixes,
)
from sedd.checkpoints.loaded import (
    SourceParts,
)
from sedd.config import (
    GraphConfig,
    LogLinearNoiseConfig,
    ModelConfig,
    Provenance,
    ST3Arch,
    ST3PerturbationArch,
    TokenConfig,
)
from sedd.files import sha256_file

__all__ = [
    "choose_st3_checkpoint",
    "load_st3",
    "read_gene_list",
    "read_label_mapping",
    "read_vectors",
    "with_label_files",
]

ST3_EPS = 1e-3  # st3's log-linear schedule
_EPOCH_FILE = re.compile(r"epoch_(\d+)\.pt")
_NAME_FILES = ("perturbation_names_all.txt", "perturbation_names_all.pt")
_GENE_FILES = ("genes.txt", "gene_names.txt")


def choose_st3_checkpoint(exp_dir: Path, name: str | None = None) -> Path:
    """``name`` if given, else best.pt > final.pt > the highest epoch_N.pt."""
    candidates = sorted(p.name for p in exp_dir.glob("*.pt"))
    if name is not None:
        path = Path(name) if Path(name).is_absolute() else exp_dir / name
        if not path.is_file():
            raise CheckpointError(
                f"checkpoint {path} does not exist; {exp_dir} holds: "
                f"{', '.join(candidates) or 'no .pt files'}."
            )
        return path
    for preferred in ("best.pt", "final.pt"):
        if (exp_dir / preferred).is_file():
            return exp_dir / preferred
    epochs = [(int(m.group(1)), n) for n in candidates if (m := _EPOCH_FILE.fullmatch(n))]
    if epochs:
        return exp_dir / max(epochs)[1]
    raise CheckpointError(
        f"no checkpoint in st3 experiment {exp_dir}: expected best.pt, final.pt or epoch_N.pt "
        f"(found: {', '.join(candidates) or 'no .pt files'}); pass --checkpoint FILE."
    )


def _state_from_payload(payload: Any, file: Path) -> dict[str, torch.Tensor]:
    if isinstance(payload, dict) and isinstance(payload.get("model_state_dict"), dict):
        return strip_wrapper_prefixes(payload["model_state_dict"])
    if (
        isinstance(payload, dict)
        and payload
        and all(isinstance(v, torch.Tensor) for v in payload.values())
    ):
        return strip_wrapper_prefixes(payload)  # a bare state dict
    keys = list(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
    raise CheckpointError(
        f"{file} holds no model weights: expected a dict with 'model_state_dict' (st3) or a "
        f"state dict, found {keys}. Pick another checkpoint file."
    )


def _st3_arch(
    args: dict[str, Any], state: dict[str, torch.Tensor], args_file: Path
) -> ST3Arch | ST3PerturbationArch:
    """Constructor arguments from args.json, falling back to tensor shapes."""

    def from_args(key: str) -> int | None:
        value = args.get(key)
        return None if value is None else int(value)

    def shape(key: str, axis: int) -> int:
        if key not in state:
            raise CheckpointError(
                f"the st3 weights lack {key!r}, needed for a dimension that {args_file} does not "
                "give; pick a complete checkpoint file."
            )
        return int(state[key].shape[axis])

    vocab = from_args("vocab_size")
    num_bins = from_args("num_bins") or (vocab - 1 if vocab else shape("token_embed.weight", 0) - 1)
    hidden = from_args("hidden_dim") or shape("token_embed.weight", 1)
    layers = from_args("num_layers") or len(
        {key.split(".")[1] for key in state if key.startswith("blocks.")}
    )
    heads = from_args("num_heads")
    if not heads:
        raise CheckpointError(
            f"{args_file} has no num_heads, and tensor shapes cannot tell the head count; add "
            '"num_heads": N to it (st3 experiment names like 128,4,4 are hidden,layers,heads).'
        )
    ff_key = "blocks.0.ff.net.0.weight"
    common = {
        "num_genes": from_args("num_genes") or shape("gene_embed.weight", 0),
        "num_bins": num_bins,
        "hidden_dim": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "ff_mult": from_args("ff_mult") or (shape(ff_key, 0) // hidden if ff_key in state else 4),
        "dropout": float(args.get("dropout", 0.1)),
    }
    if "pert_embed.weight" not in state and not from_args("num_perturbations"):
        return ST3Arch(**common, max_seq_len=from_args("max_seq_len"))
    vector_dim = from_args("precomputed_emb_dim")
    if vector_dim is None and "precomputed_proj.weight" in state:
        vector_dim = shape("precomputed_proj.weight", 1)
    cell_types = args.get("num_cell_types")
    if cell_types is None and "cell_type_embed.weight" in state:
        cell_types = shape("cell_type_embed.weight", 0)
    return ST3PerturbationArch(
        **common,
        num_perturbations=from_args("num_perturbations") or shape("pert_embed.weight", 0),
        precomputed_emb_dim=vector_dim,
        num_cell_types=int(cell_types) if cell_types else None,
    )


def load_st3(
    path: Path,
    *,
    checkpoint: str | None = None,
    genes: str | Path | None = None,
    perturbations: str | Path | None = None,
    vectors: str | Path | None = None,
) -> SourceParts:
    """Read an st3 experiment directory (or a ``.pt`` file inside one)."""
    exp_dir = path if path.is_dir() else path.parent
    if path.is_file():
        checkpoint = checkpoint or path.name
    args_file = exp_dir / "args.json"
    args = _read_args(args_file)
    weights = choose_st3_checkpoint(exp_dir, checkpoint)
    payload = read_torch_file(weights)
    state = _state_from_payload(payload, weights)
    arch = _st3_arch(args, state, args_file)
    perturbation_model = isinstance(arch, ST3PerturbationArch)
    cell_types = None
    if perturbation_model and arch.num_cell_types:
        mapping = args.get("cell_type_to_idx") or None
        if mapping is not None:
            cell_types = _names_from_mapping(mapping, arch.num_cell_types, args_file, "cell type")
    config = ModelConfig(
        architecture="st3_perturbation" if perturbation_model else "st3",
        arch=arch,
        parametrisation="x0",
        graph=GraphConfig(type="absorb", dim=arch.num_bins + 1),
        noise=LogLinearNoiseConfig(eps=ST3_EPS),
        tokens=TokenConfig(
            num_bins=arch.num_bins, mask_index=arch.num_bins, vocab_size=arch.num_bins + 1
        ),
        genes=[str(i) for i in range(arch.num_genes)],
        genes_by_position=True,
        control_label=args.get("control_name") if perturbation_model else None,
        cell_types=cell_types,
        provenance=Provenance(
            source=str(exp_dir),
            source_format="st3",
            source_file=weights.name,
            source_hash=(file_hash := sha256_file(weights)),
            step=_int_or_none(payload.get("step") if isinstance(payload, dict) else None),
            ema=False,
            training_args=args,
        ),
    )
    parts = SourceParts(config, state, weights, file_hash, described_by=str(args_file))

    # Side files: explicit ones first, then st3's conventional names in the experiment dir.
    def default(names: tuple[str, ...]) -> Path | None:
        return next((exp_dir / n for n in names if (exp_dir / n).is_file()), None)

    if perturbation_model:
        perturbations = perturbations or default(_NAME_FILES)
        if vectors is None and arch.precomputed_emb_dim:
            vectors = _resolve(args.get("cond_labels_pt_path"), exp_dir) or default(
                ("protein_embeddings.pt",)
            )
    return with_label_files(
        parts, genes=genes or default(_GENE_FILES), perturbations=perturbations, vectors=vectors
    )


def _read_args(args_file: Path) -> dict[str, Any]:
    args = read_json(args_file)
    if not isinstance(args, dict):
        raise CheckpointError(f"{args_file} must hold a JSON object of training arguments.")
    return args


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _resolve(value: Any, base: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value) if Path(value).is_absolute() else base / value
    return path if path.is_file() else None


# ----------------------------------------------------------------------------------------------
# Side files
# ----------------------------------------------------------------------------------------------


def read_gene_list(path: str | Path, num_genes: int) -> list[str]:
    """Gene names in model order: a text file (one a line) or an h5ad's ``var_names``."""
    path = require_file(Path(path), "gene list")
    if path.suffix == ".h5ad":
        import anndata  # slow to import; only h5ad gene lists need it

        try:
            adata = anndata.read_h5ad(path, backed="r")
        except Exception as err:  # h5py / anndata raise many types on bad files
            raise CheckpointError(f"cannot read {path} as h5ad ({err}); pass a text list.") from err
        names = [str(n) for n in adata.var_names]
        adata.file.close()
    else:
        try:
            names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise CheckpointError(f"{path} is not a text gene list (one name a line).") from None
    if len(names) != num_genes:
        raise CheckpointError(
            f"gene list {path} has {len(names)} names but the model has {num_genes} genes; pass "
            "the gene list the model was trained on, in training order."
        )
    repeated = [name for name, n in Counter(names).items() if n > 1]
    if repeated:
        raise CheckpointError(
            f"gene list {path} names genes more than once: {repeated[:10]}; make them unique "
            "(e.g. anndata's var_names_make_unique) before converting."
        )
    return names


def _names_from_mapping(mapping: Any, expected: int, file: Path, kind: str) -> list[str]:
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


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    repeated = [key for key, n in Counter(k for k, _ in pairs).items() if n > 1]
    if repeated:
        raise ValueError(f"names listed more than once: {repeated[:10]}")
    return dict(pairs)


def read_label_mapping(path: str | Path, expected: int, kind: str = "perturbation") -> list[str]:
    """Names by index from JSON ({name: index} or [names]), text (line i = index i) or .pt."""
    path = require_file(Path(path), f"{kind} mapping")
    if path.suffix in (".pt", ".pth"):
        mapping = read_torch_file(path)
    elif path.suffix == ".json":
        try:
            mapping = json.loads(path.read_text(), object_pairs_hook=_reject_duplicate_keys)
        except ValueError as err:  # JSONDecodeError is a ValueError too
            raise CheckpointError(f"{path}: {err}; each label must appear once.") from None
    else:
        lines = path.read_text().splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        mapping = [line.strip() for line in lines]
        if "" in mapping:
            raise CheckpointError(
                f"{path} has an empty line {mapping.index('') + 1}; line i must name label index i."
            )
    if isinstance(mapping, list | tuple):
        return _names_from_list(list(mapping), expected, path, kind)
    return _names_from_mapping(mapping, expected, path, kind)


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
    warn_positional: bool = True,
) -> SourceParts:
    """Apply side files to ``parts.config``; note (for a warning) what stays unnamed."""
    config = parts.config
    notes = list(parts.notes)
    update: dict[str, Any] = {}
    new_vectors = parts.vectors
    if genes is not None:
        update |= {"genes": read_gene_list(genes, config.num_genes), "genes_by_position": False}
    elif config.genes_by_position and warn_positional:
        notes.append(
            f"no gene list for {parts.weights_file}: genes are named by position "
            f"('0'..'{config.num_genes - 1}'). Pass --genes FILE (one name a line, or an h5ad "
            "whose var_names are used) to name them."
        )
    vector_dim = getattr(config.arch, "precomputed_emb_dim", None)
    if (perturbations is not None or vectors is not None) and not config.num_perturbations:
        raise CheckpointError(
            f"{parts.weights_file} holds an unconditional model; it takes no perturbation "
            "labels, so leave out --perturbations / --vectors."
        )
    if vectors is not None:
        if not vector_dim:
            raise CheckpointError(
                f"{parts.weights_file} has no precomputed_proj, so it cannot take perturbation "
                f"vectors; leave out --vectors {vectors}."
            )
        new_vectors = read_vectors(vectors, vector_dim)
        update["perturbation_vectors"] = True
    if perturbations is not None:
        names = read_label_mapping(perturbations, config.num_perturbations)
        update["perturbations"] = names
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
            "index. Pass --perturbations FILE (JSON {name: index}, or one name a line)."
        )
    new_config = ModelConfig.model_validate(config.model_copy(update=update).model_dump())
    return dataclasses.replace(parts, config=new_config, vectors=new_vectors, notes=notes)
