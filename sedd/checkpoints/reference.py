"""Reference SEDD checkpoints (louaaron/Score-Entropy-Discrete-Diffusion).

Two layouts:

* a model directory, as ``save_pretrained`` / the published ``louaaron/sedd-*`` repositories
  write it: ``config.json`` (the run's full config: ``tokens``, ``graph.type``, ``noise.*``,
  ``model.*``) + ``model.safetensors`` or ``pytorch_model.bin``, holding the EMA weights;
* a training run: ``RUN/.hydra/config.yaml`` + ``RUN/checkpoints-meta/checkpoint.pth`` (the
  latest snapshot) and ``RUN/checkpoints/checkpoint_N.pth``, each
  ``{"model": raw weights, "ema": {"decay", "num_updates", "shadow_params"}, "optimizer",
  "step"}``. ``shadow_params`` lists the EMA parameters in ``model.parameters()`` order, i.e.
  the state-dict order without buffers (``rotary_emb.inv_freq``).
"""

from __future__ import annotations

import re
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
    CONFIG_FILE,
    WEIGHTS_FILE,
    SourceParts,
    build_model,
)
from sedd.checkpoints.schema import (
    DDiTArch,
    GeometricNoiseConfig,
    GraphConfig,
    LogLinearNoiseConfig,
    ModelConfig,
    Provenance,
    TokenConfig,
)
from sedd.io.files import sha256_file
from sedd.io.yaml_files import YamlFileError, read_yaml

__all__ = ["config_from_reference", "load_sedd_hf", "load_sedd_run"]

BIN_FILE = "pytorch_model.bin"
_STEP_FILE = re.compile(r"checkpoint_(\d+)\.pth")


def config_from_reference(cfg: Any, file: Path, provenance: Provenance) -> ModelConfig:
    """Our config for the reference's (``tokens``, ``graph``, ``noise``, ``model``) dict."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file} must hold the reference SEDD config as a mapping.")
    try:
        graph_type, noise, model = cfg["graph"]["type"], cfg["noise"], cfg["model"]
        tokens = int(cfg["tokens"])
        dims = {k: int(model[k]) for k in ("hidden_size", "cond_dim", "n_blocks", "n_heads")}
        length = int(model["length"])
        noise_type = noise["type"]
    except (KeyError, TypeError) as err:
        raise CheckpointError(
            f"{file} lacks reference SEDD config key {err}; it needs tokens, graph.type, "
            "noise.type and model.{hidden_size,cond_dim,n_blocks,n_heads,length}."
        ) from None
    if model.get("type", "ddit") != "ddit":
        raise CheckpointError(f"{file}: model.type {model['type']!r} is not supported (only ddit).")
    if graph_type not in ("absorb", "uniform"):
        raise CheckpointError(f"{file}: graph.type must be absorb or uniform, got {graph_type!r}.")
    absorb = graph_type == "absorb"
    vocab = tokens + 1 if absorb else tokens
    match noise_type:
        case "loglinear":
            noise_config: Any = LogLinearNoiseConfig()  # the reference uses eps = 1e-3
        case "geometric":
            noise_config = GeometricNoiseConfig(
                sigma_min=float(noise["sigma_min"]), sigma_max=float(noise["sigma_max"])
            )
        case other:
            raise CheckpointError(
                f"{file}: noise.type must be loglinear or geometric, got {other!r}."
            )
    return ModelConfig(
        architecture="ddit",
        arch=DDiTArch(
            vocab_size=vocab,
            length=length,
            graph=graph_type,
            scale_by_sigma=bool(model.get("scale_by_sigma", absorb)),
            dropout=float(model.get("dropout", 0.1)),
            **dims,
        ),
        parametrisation="score",
        graph=GraphConfig(type=graph_type, dim=vocab),
        noise=noise_config,
        tokens=TokenConfig(
            num_bins=tokens, mask_index=tokens if absorb else None, vocab_size=vocab
        ),
        genes=[str(i) for i in range(length)],
        genes_by_position=True,
        provenance=provenance.model_copy(update={"training_args": cfg}),
    )


def load_sedd_hf(path: Path, *, checkpoint: str | None = None) -> SourceParts:
    """A reference model directory: config.json + model.safetensors (or pytorch_model.bin)."""
    root = path if path.is_dir() else path.parent
    if checkpoint is None and path.is_file() and path.name != CONFIG_FILE:
        checkpoint = path.name
    if checkpoint is not None:
        weights = require_file(root / checkpoint, "weights file")
    else:
        weights = next((root / n for n in (WEIGHTS_FILE, BIN_FILE) if (root / n).is_file()), None)
        if weights is None:
            raise CheckpointError(
                f"{root} has a reference SEDD config.json but no weights: expected "
                f"{WEIGHTS_FILE} or {BIN_FILE} next to it."
            )
    if weights.suffix == ".safetensors":
        state = read_safetensors(weights)[0]
    else:
        state = read_torch_file(weights)
        if not isinstance(state, dict):
            raise CheckpointError(
                f"{weights} must hold a state dict, found {type(state).__name__}."
            )
    file_hash = sha256_file(weights)
    provenance = Provenance(
        source=str(root),
        source_format="sedd_hf",
        source_file=weights.name,
        source_hash=file_hash,
        ema=None,
    )
    config = config_from_reference(read_json(root / CONFIG_FILE), root / CONFIG_FILE, provenance)
    return SourceParts(
        config,
        strip_wrapper_prefixes(state),
        weights,
        file_hash,
        described_by=str(root / CONFIG_FILE),
    )


def _run_checkpoint(root: Path, name: str | None) -> Path:
    """``name`` (in RUN, RUN/checkpoints or RUN/checkpoints-meta), else the latest snapshot."""
    if name is not None:
        for base in (root, root / "checkpoints", root / "checkpoints-meta"):
            if (base / name).is_file():
                return base / name
        raise CheckpointError(
            f"checkpoint {name!r} is in none of {root}, {root}/checkpoints, "
            f"{root}/checkpoints-meta; pass a file that exists."
        )
    meta = root / "checkpoints-meta" / "checkpoint.pth"
    if meta.is_file():
        return meta
    steps = [
        (int(m.group(1)), p)
        for p in (root / "checkpoints").glob("checkpoint_*.pth")
        if (m := _STEP_FILE.fullmatch(p.name))
    ]
    if steps:
        return max(steps)[1]
    raise CheckpointError(
        f"no checkpoint in reference SEDD run {root}: expected checkpoints-meta/checkpoint.pth "
        "or checkpoints/checkpoint_N.pth; pass --checkpoint FILE."
    )


def _read_run_config(root: Path) -> tuple[Any, Path]:
    path = require_file(root / ".hydra" / "config.yaml", "reference SEDD run config")
    try:  # bounded: a file too large or an alias bomb is refused before it expands
        return read_yaml(path, what="reference SEDD run config"), path
    except YamlFileError as err:
        raise CheckpointError(str(err)) from None


def _ema_state(
    raw: dict[str, torch.Tensor], shadow: Any, config: ModelConfig, file: Path
) -> dict[str, torch.Tensor]:
    """The raw state with every parameter replaced by its EMA shadow (buffers stay raw)."""
    try:
        with torch.device("meta"):  # names only: nothing is allocated
            model = build_model(config)
    except ValueError as err:
        raise CheckpointError(f"{file}: its config describes an invalid model: {err}") from None
    if set(raw) != set(model.state_dict()):
        return raw  # the strict key check reports what is missing or unexpected
    param_names = {name for name, _ in model.named_parameters()}
    # model.parameters() order is the state-dict order without buffers.
    order = [key for key in raw if key in param_names]
    if not isinstance(shadow, list | tuple) or len(shadow) != len(order):
        found = len(shadow) if isinstance(shadow, list | tuple) else type(shadow).__name__
        raise CheckpointError(
            f"{file}: ema.shadow_params must list one tensor per model parameter "
            f"({len(order)}), found {found}; load the raw weights instead (use_ema=False / "
            "--raw-weights)."
        )
    state = dict(raw)
    for name, tensor in zip(order, shadow, strict=True):
        if not isinstance(tensor, torch.Tensor) or tensor.shape != raw[name].shape:
            found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
            raise CheckpointError(
                f"{file}: EMA shadow parameter for {name!r} has shape {found}, expected "
                f"{tuple(raw[name].shape)}; the EMA list is out of order or from another model."
            )
        state[name] = tensor
    return state


def load_sedd_run(
    path: Path, *, checkpoint: str | None = None, use_ema: bool = True
) -> SourceParts:
    """A reference training run directory, or a ``.pth`` inside ``RUN/checkpoints*/``."""
    if path.is_file():
        root, weights = path.parent.parent, path
    else:
        root = path
        weights = _run_checkpoint(root, checkpoint)
    cfg, cfg_file = _read_run_config(root)
    payload = read_torch_file(weights)
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
        found = list(payload)[:8] if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(
            f"{weights} is not a reference SEDD training checkpoint: expected a dict with "
            f"'model', 'ema' and 'step', found {found}."
        )
    raw = strip_wrapper_prefixes(payload["model"])
    file_hash = sha256_file(weights)
    step = payload.get("step")
    provenance = Provenance(
        source=str(root),
        source_format="sedd_run",
        source_file=str(weights.relative_to(root)),
        source_hash=file_hash,
        step=int(step) if isinstance(step, int) else None,
        ema=use_ema,
    )
    config = config_from_reference(cfg, cfg_file, provenance)
    parts = SourceParts(config, raw, weights, file_hash, described_by=str(cfg_file))
    if not use_ema:
        return parts
    ema = payload.get("ema")
    if not isinstance(ema, dict) or "shadow_params" not in ema:
        parts.notes.append(f"{weights} has no EMA weights (ema.shadow_params); using the raw ones.")
        parts.config.provenance.ema = False
        return parts
    parts.state = _ema_state(raw, ema["shadow_params"], config, weights)
    return parts
