"""st3 experiment directories: the checkpoint to read, its architecture and its labels.

An st3 experiment directory holds ``args.json`` (the training arguments) and ``best.pt``,
``final.pt`` and ``epoch_N.pt``, each ``{"model_state_dict": ..., "optimizer_state_dict": ...,
"step", "epoch", "best_loss", "history"}``. Inference picks best > final > highest epoch.
Dimensions missing from ``args.json`` come from tensor shapes. st3's training scripts write no
gene names, so the genes are named by a side file: ``--genes FILE`` when given, else the first
of ``genes.json`` (a JSON list of names in model order, or ``{name: index}``), ``genes.txt`` and
``gene_names.txt`` (one name a line) found next to the checkpoints, else genes stay positional.
Perturbation names come from ``perturbation_names_all.txt`` (line i names index i, control = 0)
or a mapping file; cell types from ``args.json``'s ``cell_type_to_idx``; perturbation vectors
(e.g. ESM2) from a ``{name: tensor}`` file.

Two relatives of st3's networks load too, picked by what the experiment says, never by a guess:

* aivc-dcm (st3's fork) writes ``model_name`` into ``args.json``: ``SEDDPerturbationTransformer``
  (+ ``Small``/``Medium``/``Large``) is st3's perturbation model, and
  ``SEDDPerturbationTransformerSeparateFiLM`` (+ sizes) the same weights around a FiLM per
  signal (``conditioning="separate_film"``). A ``model_name`` we cannot build is refused.
* st3's cell-type trainer (branch mismatch-celltype) writes ``model_size`` (small, medium,
  large) and saves ``SEDDCellTypePerturbationTransformer`` weights (``celltype_embed``,
  ``celltype_proj``, ``precomputed_pert_proj``): st3's summed perturbation model with cell types
  required, so its weights are renamed to ours and ``cell_types_required`` is set. Its
  ``args.json`` lists ``cell_types`` and ``perturbations`` by index (its inference script
  numbers them by position). Cell types given as vectors (``precomputed_celltype_proj``) are
  refused: sedd passes cell types as indices.

``provenance.source_class`` records the upstream class.

The side-file readers (``read_gene_list``, ``read_label_mapping``, ``read_vectors``,
``with_label_files``) accept these conventions for every source format; they live in
``sedd.checkpoints.labels`` and are re-exported here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from sedd.checkpoints.io import (
    CheckpointError,
    read_json,
    read_torch_file,
    strip_wrapper_prefixes,
)
from sedd.checkpoints.labels import (
    label_file_kind,
    read_gene_list,
    read_label_mapping,
    read_vectors,
    with_label_files,
)
from sedd.checkpoints.loaded import SourceParts
from sedd.checkpoints.schema import (
    RESERVED_OBS_COLUMNS,
    GraphConfig,
    LogLinearNoiseConfig,
    ModelConfig,
    Provenance,
    ST3Arch,
    ST3PerturbationArch,
    TokenConfig,
)
from sedd.checkpoints.st3_families import UpstreamClass, upstream_class, with_st3_names
from sedd.checkpoints.st3_labels import LabelNames, index_file_needed, label_names, same_order
from sedd.io.files import sha256_file

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
_GENE_FILES = ("genes.json", "genes.txt", "gene_names.txt")  # the first found names the genes


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
    args: dict[str, Any],
    state: dict[str, torch.Tensor],
    args_file: Path,
    upstream: UpstreamClass | None = None,
) -> ST3Arch | ST3PerturbationArch:
    """Constructor arguments from args.json, falling back to tensor shapes; ``upstream`` (when
    the experiment names its class) decides the family, else the weights do."""

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
    family = upstream.family if upstream is not None else None
    if family == "st3" or (
        family is None and "pert_embed.weight" not in state and not from_args("num_perturbations")
    ):
        return ST3Arch(**common, max_seq_len=from_args("max_seq_len"))
    vector_dim = from_args("precomputed_emb_dim")
    if vector_dim is None and "precomputed_proj.weight" in state:
        vector_dim = shape("precomputed_proj.weight", 1)
    cell_types = args.get("num_cell_types")
    if (cell_types is None and "cell_type_embed.weight" in state) or (
        family == "cell_type" and not cell_types
    ):
        cell_types = shape("cell_type_embed.weight", 0)
    return ST3PerturbationArch(
        **common,
        num_perturbations=from_args("num_perturbations") or shape("pert_embed.weight", 0),
        precomputed_emb_dim=vector_dim,
        num_cell_types=int(cell_types) if cell_types else None,
        conditioning="separate_film" if family == "separate_film" else "sum",
        cell_types_required=family == "cell_type",
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
    upstream = upstream_class(args, state, args_file)
    state = with_st3_names(state, upstream, weights)
    arch = _st3_arch(args, state, args_file, upstream)
    names = label_names(args, arch, args_file)
    file_hash = sha256_file(weights)
    step = _int_or_none(payload.get("step") if isinstance(payload, dict) else None)
    config = _st3_config(args, arch, names, exp_dir, weights, file_hash, step, upstream)
    parts = SourceParts(config, state, weights, file_hash, described_by=str(args_file))

    # Side files: explicit ones first, then st3's conventional names in the experiment dir.
    def default(names: tuple[str, ...]) -> Path | None:
        return next((exp_dir / n for n in names if (exp_dir / n).is_file()), None)

    index_file = None
    if isinstance(arch, ST3PerturbationArch):
        # The label file training read (args.json's cond_labels_pt_path): {name: vector} for a
        # vector-conditioned model, {name: index} for DCM's scalar labels. An index file fixes
        # every name's index, so a name list can never reorder them.
        named = _resolve(args.get("cond_labels_pt_path"), exp_dir)
        if named is not None and label_file_kind(named) == "indices":
            index_file = named
        elif vectors is None and arch.precomputed_emb_dim:
            vectors = named or default(("protein_embeddings.pt",))
        if names.perturbations is not None and perturbations is not None:
            same_order(perturbations, names.perturbations, arch, args_file)
            perturbations = None  # args.json's own list: what training used
        if perturbations is None and index_file is None and names.perturbations is None:
            perturbations = default(_NAME_FILES) or _resolve(
                args.get("all_perturbations_file"), exp_dir
            )
        index_file_needed(args, arch, named, perturbations, args_file)
    gene_file = genes or default(_GENE_FILES)
    return with_label_files(
        parts,
        genes=gene_file,
        perturbations=perturbations,
        vectors=vectors,
        index_file=index_file,
        genes_beside_checkpoint=genes is None and gene_file is not None,
    )


def _st3_config(
    args: dict[str, Any],
    arch: ST3Arch | ST3PerturbationArch,
    names: LabelNames,
    exp_dir: Path,
    weights: Path,
    file_hash: str,
    step: int | None,
    upstream: UpstreamClass | None = None,
) -> ModelConfig:
    """The native config of an st3 model: absorbing graph, st3's noise, genes by position."""
    perturbation_model = isinstance(arch, ST3PerturbationArch)
    control = args.get("control_name") if perturbation_model else None
    if names.perturbations is not None and control not in names.perturbations:
        control = None  # with_label_files picks index 0, st3's control
    return ModelConfig(
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
        perturbations=names.perturbations,
        control_label=control,
        cell_types=names.cell_types,
        label_key=_label_key(args) if perturbation_model else None,
        label_kind="perturbation",
        provenance=Provenance(
            source=str(exp_dir),
            source_format="st3",
            source_file=weights.name,
            source_hash=file_hash,
            step=step,
            ema=False,
            training_args=args,
            source_class=upstream.name if upstream is not None else None,
        ),
    )


def _label_key(args: dict[str, Any]) -> str | None:
    """The obs column st3's perturbation training read the labels from (its ``--gene``)."""
    key = args.get("gene")
    if not isinstance(key, str) or not key.strip() or key in RESERVED_OBS_COLUMNS:
        return None
    return key


def _read_args(args_file: Path) -> dict[str, Any]:
    args = read_json(args_file)
    if not isinstance(args, dict):
        raise CheckpointError(f"{args_file} must hold a JSON object of training arguments.")
    return args


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _resolve(value: Any, base: Path) -> Path | None:
    """A file args.json names: relative to the experiment directory, else to the working
    directory (where training ran, as DCM's and st3's job scripts do)."""
    if not isinstance(value, str) or not value:
        return None
    for path in (Path(value) if Path(value).is_absolute() else base / value, Path(value)):
        if path.is_file():
            return path
    return None
