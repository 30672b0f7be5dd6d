"""Load and save models: format detection, safe file reading, strict weight matching.

Supported sources (``detect_layout``):

* ``"native"``: our format, a directory with ``config.json`` (``sedd.config.ModelConfig``),
  ``model.safetensors`` (fp32) and, for vector-conditioned models,
  ``perturbation_vectors.safetensors`` (name -> vector).
* ``"st3"``: an st3 experiment directory (``args.json`` + ``best.pt`` / ``final.pt`` /
  ``epoch_N.pt``), or one ``.pt`` file inside one (``sedd.checkpoint_st3``).
* ``"sedd_hf"``: a reference SEDD model directory, ``config.json`` + ``model.safetensors`` or
  ``pytorch_model.bin`` (``sedd.checkpoint_ref``).
* ``"sedd_run"``: a reference SEDD training run (``.hydra/config.yaml`` +
  ``checkpoints-meta/checkpoint.pth``), or a ``checkpoint.pth`` inside one.

Nothing here unpickles code: ``.pt`` files go through ``torch.load(weights_only=True)``, which
refuses any object that is not a tensor or a plain container, and safetensors holds no code.
Every user-caused failure raises ``CheckpointError`` naming the file and what to do.
"""

from __future__ import annotations

import difflib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ValidationError
from safetensors.torch import save_file
from torch import nn

from sedd.checkpoint_io import (
    CheckpointError,
    CheckpointNotFoundError,
    read_json,
    read_safetensors,
    sha256_file,
)
from sedd.config import ModelConfig
from sedd.ddit import DDiT
from sedd.graph import Graph, graph_from_config
from sedd.model import SEDDPerturbationTransformer, SEDDTransformer
from sedd.noise import Noise, noise_from_config

__all__ = [
    "CONFIG_FILE",
    "VECTORS_FILE",
    "WEIGHTS_FILE",
    "CheckpointError",
    "CheckpointNotFoundError",
    "Layout",
    "LoadedModel",
    "UnknownLabelError",
    "build_model",
    "detect_layout",
    "load_checkpoint",
    "save_native",
]

Layout = Literal["native", "st3", "sedd_hf", "sedd_run"]
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VECTORS_FILE = "perturbation_vectors.safetensors"
_EXPECTED_LAYOUTS = (
    "a native model directory (config.json with schema_version + model.safetensors), "
    "an st3 experiment directory (args.json + best.pt / final.pt / epoch_N.pt), "
    "a reference SEDD model directory (config.json + model.safetensors or pytorch_model.bin), "
    "or a reference SEDD training run (.hydra/config.yaml + checkpoints-meta/checkpoint.pth)"
)


class UnknownLabelError(ValueError):
    """A perturbation or cell-type name the model does not know; ``suggestions`` are close ones."""

    def __init__(self, name: str, kind: str, known: Sequence[str], hint: str = "") -> None:
        self.name, self.kind = name, kind
        # Case-insensitive: "gene_a" should suggest "GENE_A" first.
        folded = {k.casefold(): k for k in reversed(known)}
        close = difflib.get_close_matches(name.casefold(), list(folded), n=3)
        self.suggestions: list[str] = [folded[k] for k in close]
        if not known:
            message = f"unknown {kind} {name!r}: this model has no {kind} names. {hint}".strip()
        else:
            message = f"unknown {kind} {name!r}"
            if self.suggestions:
                message += f"; did you mean {', '.join(map(repr, self.suggestions))}?"
            shown = ", ".join(map(repr, list(known)[:10])) + (", ..." if len(known) > 10 else "")
            message += f" The model knows {len(known)}: {shown}."
        super().__init__(message)


@dataclass
class LoadedModel:
    """A model ready to serve: eval mode, fp32, on the requested device."""

    model: nn.Module
    config: ModelConfig
    noise: Noise
    graph: Graph
    path: Path  # the source as given (directory or file)
    file_hash: str  # sha256 of the weights file
    perturbation_vectors: dict[str, torch.Tensor] | None = None  # name -> (E,) on the device
    layout: Layout = "native"
    weights_file: Path | None = None

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def label_index(self, name: str) -> int:
        """Index of perturbation ``name`` in the model's label embedding."""
        names = self.config.perturbations or []
        if name in names:
            return names.index(name)
        hint = "Pass the training label mapping with --perturbations FILE."
        raise UnknownLabelError(name, "perturbation", names, hint)

    def cell_type_index(self, name: str) -> int:
        names = self.config.cell_types or []
        if name in names:
            return names.index(name)
        raise UnknownLabelError(name, "cell type", names)

    def perturbation_labels(self, names: Sequence[str]) -> torch.Tensor:
        """Model input for perturbation ``names``: vectors (B, E) when the model has a vector
        file, else indices (B,)."""
        if self.perturbation_vectors is not None:
            missing = [n for n in names if n not in self.perturbation_vectors]
            if missing:
                raise UnknownLabelError(missing[0], "perturbation", list(self.perturbation_vectors))
            return torch.stack([self.perturbation_vectors[n] for n in names])  # (B, E)
        indices = [self.label_index(n) for n in names]
        return torch.tensor(indices, dtype=torch.long, device=self.device)  # (B,)

    def cell_type_labels(self, names: Sequence[str]) -> torch.Tensor:
        indices = [self.cell_type_index(n) for n in names]
        return torch.tensor(indices, dtype=torch.long, device=self.device)  # (B,)


@dataclass
class SourceParts:
    """What a layout reader hands back: a config and the weights it describes."""

    config: ModelConfig
    state: dict[str, torch.Tensor]
    weights_file: Path
    file_hash: str
    vectors: dict[str, torch.Tensor] | None = None
    described_by: str = CONFIG_FILE  # where the expected shapes come from (for messages)
    notes: list[str] = field(default_factory=list)  # warnings for the caller of load_checkpoint


def _listing(keys: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_state_strict(model: nn.Module, state: Mapping[str, Any], parts: SourceParts) -> None:
    """Copy ``state`` into ``model``; every key must match by name and shape."""
    file = parts.weights_file
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"missing keys (the model needs them): {_listing(missing)}")
        if unexpected:
            problems.append(
                f"unexpected keys (the model has no such weights): {_listing(unexpected)}"
            )
        raise CheckpointError(
            f"{file} does not match the {parts.config.architecture} model described by "
            f"{parts.described_by}: {'; '.join(problems)}. Check that the file and "
            f"{parts.described_by} come from the same model, or pick another checkpoint."
        )
    for key, target in expected.items():
        value = state[key]
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{file}: {key!r} is a {type(value).__name__}, not a tensor.")
        if value.shape != target.shape:
            raise CheckpointError(
                f"{file}: shape mismatch for {key!r}: expected {tuple(target.shape)} (from "
                f"{parts.described_by}), found {tuple(value.shape)}. Make {parts.described_by} "
                "describe this checkpoint, or pick the checkpoint it describes."
            )
    model.load_state_dict(state, strict=True)  # copies (and casts) into the fp32 parameters


# ----------------------------------------------------------------------------------------------
# Layout detection and loading
# ----------------------------------------------------------------------------------------------


def _dir_layout(path: Path) -> Layout | None:
    config_file = path / CONFIG_FILE
    if config_file.is_file():
        config = read_json(config_file)
        if isinstance(config, dict) and ("schema_version" in config or "architecture" in config):
            return "native"
        if isinstance(config, dict) and "model" in config and "tokens" in config:
            return "sedd_hf"
    if (path / "args.json").is_file():
        return "st3"
    if (path / ".hydra" / "config.yaml").is_file() or (path / "checkpoints-meta").is_dir():
        return "sedd_run"
    return None


def detect_layout(path: str | Path) -> Layout:
    """Which kind of checkpoint ``path`` is; ``CheckpointError`` when it is none of them."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{path} does not exist; pass {_EXPECTED_LAYOUTS}.")
    if path.is_dir():
        layout = _dir_layout(path)
        if layout is not None:
            return layout
        found = sorted(p.name for p in path.iterdir())[:8]
        raise CheckpointError(
            f"cannot tell what kind of checkpoint {path} is (it holds: "
            f"{', '.join(found) or 'nothing'}); pass {_EXPECTED_LAYOUTS}."
        )
    if path.name in (CONFIG_FILE, WEIGHTS_FILE, "pytorch_model.bin"):
        parent = _dir_layout(path.parent)
        if parent in ("native", "sedd_hf"):
            return parent
    if path.suffix in (".pt", ".pth", ".bin") and (path.parent / "args.json").is_file():
        return "st3"
    if path.suffix == ".pth" and (path.parent.parent / ".hydra" / "config.yaml").is_file():
        return "sedd_run"
    raise CheckpointError(
        f"cannot tell what kind of checkpoint {path} is: a single file loads only inside its "
        f"directory (st3: next to args.json; reference runs: under RUN/checkpoints*/ with "
        f"RUN/.hydra/config.yaml). Pass {_EXPECTED_LAYOUTS}."
    )


def build_model(config: ModelConfig) -> nn.Module:
    """A freshly initialised network of the architecture ``config`` describes."""
    kwargs = config.arch.model_dump()
    match config.architecture:
        case "st3":
            return SEDDTransformer(**kwargs)
        case "st3_perturbation":
            return SEDDPerturbationTransformer(**kwargs)
        case "ddit":
            return DDiT(**kwargs)


def read_model_config(path: Path) -> ModelConfig:
    try:
        return ModelConfig.model_validate(read_json(path))
    except ValidationError as err:
        raise CheckpointError(f"{path} is not a valid model config: {_problems(err)}") from None


def _problems(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
        for e in err.errors()
    )


def _load_native(root: Path, checkpoint: str | None) -> SourceParts:
    if checkpoint not in (None, WEIGHTS_FILE):
        raise CheckpointError(
            f"{root} is a native model with a single weights file ({WEIGHTS_FILE}); "
            f"leave out --checkpoint (got {checkpoint!r})."
        )
    config = read_model_config(root / CONFIG_FILE)
    weights = root / WEIGHTS_FILE
    state, _ = read_safetensors(weights)
    vectors = None
    if config.perturbation_vectors:
        vectors_file = root / VECTORS_FILE
        tensors, metadata = read_safetensors(vectors_file)
        try:
            order = json.loads(metadata.get("names", "null")) or sorted(tensors)
        except json.JSONDecodeError:
            order = None
        if not isinstance(order, list) or sorted(order) != sorted(tensors):
            raise CheckpointError(
                f"{vectors_file}: its 'names' metadata does not list its tensors; "
                "convert the model again."
            )
        vectors = {name: tensors[name].clone() for name in order}  # own memory, not the file's
    return SourceParts(config, state, weights, sha256_file(weights), vectors)


def load_checkpoint(
    source: str | Path,
    *,
    checkpoint: str | None = None,
    use_ema: bool = True,
    genes: str | Path | None = None,
    perturbations: str | Path | None = None,
    vectors: str | Path | None = None,
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Load any supported source (see the module docstring) as an fp32 eval-mode model.

    ``checkpoint`` names a file inside the source (st3: ``epoch_3.pt``; runs: a ``.pth``).
    ``use_ema=False`` takes a training run's raw weights. ``genes`` / ``perturbations`` /
    ``vectors`` name side files that replace (or supply) gene names, the perturbation
    name -> index mapping and name -> vector file.
    """
    # The layout readers import this module's helpers, so they are imported here.
    from sedd import checkpoint_ref, checkpoint_st3

    path = Path(source).expanduser()
    layout = detect_layout(path)
    label_files = {"genes": genes, "perturbations": perturbations, "vectors": vectors}
    try:
        match layout:
            case "native":
                parts = _load_native(path if path.is_dir() else path.parent, checkpoint)
            case "st3":
                parts = checkpoint_st3.load_st3(path, checkpoint=checkpoint, **label_files)
            case "sedd_hf":
                parts = checkpoint_ref.load_sedd_hf(path, checkpoint=checkpoint)
            case "sedd_run":
                parts = checkpoint_ref.load_sedd_run(path, checkpoint=checkpoint, use_ema=use_ema)
        if layout != "st3":
            parts = checkpoint_st3.with_label_files(
                parts, **label_files, warn_positional=layout != "native"
            )
    except ValidationError as err:
        raise CheckpointError(f"{path} describes an invalid model: {_problems(err)}") from None
    if not use_ema and layout in ("sedd_hf", "native") and parts.config.provenance.ema is not False:
        parts.notes.append(
            f"raw (non-EMA) weights were requested, but {path} stores one set of weights "
            "(for reference SEDD model directories, the EMA weights); loading those."
        )
    for note in parts.notes:
        warnings.warn(note, UserWarning, stacklevel=2)

    try:
        model = build_model(parts.config)
    except ValueError as err:
        raise CheckpointError(f"{parts.described_by} describes an invalid model: {err}") from None
    load_state_strict(model, parts.state, parts)
    model = model.to(device=device, dtype=torch.float32).eval()
    vecs = parts.vectors
    return LoadedModel(
        model=model,
        config=parts.config,
        noise=noise_from_config(parts.config.noise.model_dump()),
        graph=graph_from_config(parts.config.graph.model_dump()),
        path=path,
        file_hash=parts.file_hash,
        perturbation_vectors=None if vecs is None else {k: v.to(device) for k, v in vecs.items()},
        layout=layout,
        weights_file=parts.weights_file,
    )


def save_native(
    loaded: LoadedModel,
    dst: str | Path,
    *,
    training_command: str | None = None,
    data_hash: str | None = None,
) -> Path:
    """Write ``loaded`` as a native model directory (fp32); returns the directory."""
    dst = Path(dst).expanduser()
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(f"{dst} exists and is not a directory; pass a directory path.")
    if dst.resolve() == loaded.path.resolve() and loaded.layout != "native":
        raise CheckpointError(f"refusing to write the native files into the source {dst}.")
    dst.mkdir(parents=True, exist_ok=True)

    provenance = loaded.config.provenance.model_copy(
        update={
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "training_command": training_command or loaded.config.provenance.training_command,
            "data_hash": data_hash or loaded.config.provenance.data_hash,
        }
    )
    config = loaded.config.model_copy(
        update={
            "provenance": provenance,
            "perturbation_vectors": loaded.perturbation_vectors is not None,
        }
    )
    # Re-validate: model_copy(update=...) skips validation.
    config = ModelConfig.model_validate(config.model_dump())

    state = {
        key: (value.float() if value.is_floating_point() else value).detach().cpu().clone()
        for key, value in loaded.model.state_dict().items()
    }
    # One metadata key only: safetensors writes metadata in hash-map order, which changes from
    # process to process, and identical weights must give an identical file (and sha256).
    # The schema version lives in config.json.
    save_file(state, dst / WEIGHTS_FILE, metadata={"format": "pt"})
    vectors_path = dst / VECTORS_FILE
    if loaded.perturbation_vectors is not None:
        names = list(loaded.perturbation_vectors)
        tensors = {n: loaded.perturbation_vectors[n].float().cpu().contiguous() for n in names}
        save_file(tensors, vectors_path, metadata={"names": json.dumps(names)})
    elif vectors_path.exists():
        vectors_path.unlink()  # a stale file from an earlier save would contradict config.json
    (dst / CONFIG_FILE).write_text(config.model_dump_json(indent=2) + "\n")
    return dst
