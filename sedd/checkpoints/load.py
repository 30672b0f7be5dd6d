"""Load and save models: format detection, safe file reading, strict weight matching.

Supported sources (``detect_layout``):

* ``"native"``: our format, a directory with ``config.json``
  (``sedd.checkpoints.schema.ModelConfig``), ``model.safetensors`` (fp32) and, for
  vector-conditioned models, ``perturbation_vectors.safetensors`` (name -> vector).
* ``"st3"``: an st3 experiment directory (``args.json`` + ``best.pt`` / ``final.pt`` /
  ``epoch_N.pt``), or one ``.pt`` file inside one (``sedd.checkpoints.st3``).
* ``"sedd_hf"``: a reference SEDD model directory, ``config.json`` + ``model.safetensors`` or
  ``pytorch_model.bin`` (``sedd.checkpoints.reference``).
* ``"sedd_run"``: a reference SEDD training run (``.hydra/config.yaml`` +
  ``checkpoints-meta/checkpoint.pth``), or a ``checkpoint.pth`` inside one.

Nothing here unpickles code: ``.pt`` files go through ``torch.load(weights_only=True)``, which
refuses any object that is not a tensor or a plain container, and safetensors holds no code.
Every user-caused failure raises ``CheckpointError`` naming the file and what to do.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from pydantic import ValidationError

from sedd.checkpoints import reference, st3
from sedd.checkpoints.calibration import read_calibration
from sedd.checkpoints.io import CheckpointError, CheckpointNotFoundError, read_json
from sedd.checkpoints.labels import (
    PositionalGenesWarning,
    positional_genes_warning,
    with_label_files,
)
from sedd.checkpoints.loaded import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    Layout,
    LoadedModel,
    build_checked_model,
    problems,
)
from sedd.checkpoints.native import load_native
from sedd.defaults import DEFAULT_MODEL, LIBRARY_SCHEDULE
from sedd.diffusion.graph import graph_from_config
from sedd.diffusion.noise import noise_from_config

__all__ = ["DEFAULT_MODEL", "detect_layout", "load_checkpoint"]


_EXPECTED_LAYOUTS = (
    "a native model directory (config.json with schema_version + model.safetensors), "
    "an st3 experiment directory (args.json + best.pt / final.pt / epoch_N.pt), "
    "a reference SEDD model directory (config.json + model.safetensors or pytorch_model.bin), "
    "or a reference SEDD training run (.hydra/config.yaml + checkpoints-meta/checkpoint.pth)"
)


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
    path = Path(source).expanduser()
    layout = detect_layout(path)
    label_files = {"genes": genes, "perturbations": perturbations, "vectors": vectors}
    try:
        match layout:
            case "native":
                parts = load_native(path if path.is_dir() else path.parent, checkpoint)
            case "st3":
                parts = st3.load_st3(path, checkpoint=checkpoint, **label_files)
            case "sedd_hf":
                parts = reference.load_sedd_hf(path, checkpoint=checkpoint)
            case "sedd_run":
                parts = reference.load_sedd_run(path, checkpoint=checkpoint, use_ema=use_ema)
        if layout != "st3":
            parts = with_label_files(parts, **label_files, warn_positional=layout != "native")
    except ValidationError as err:
        raise CheckpointError(f"{path} describes an invalid model: {problems(err)}") from None
    if not use_ema and layout in ("sedd_hf", "native") and parts.config.provenance.ema is not False:
        parts.notes.append(
            f"raw (non-EMA) weights were requested, but {path} stores one set of weights "
            "(for reference SEDD model directories, the EMA weights); loading those."
        )
    for note in parts.notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    if parts.config.genes_by_position:
        warning = positional_genes_warning(path, parts.config.num_genes)
        warnings.warn(warning, PositionalGenesWarning, stacklevel=2)

    model = build_checked_model(parts)
    model = model.to(device=device, dtype=torch.float32).eval()
    vecs = parts.vectors  # kept on the CPU: labels are planned on the host (LoadedModel)
    calibration = read_calibration(path, parts.file_hash)
    return LoadedModel(
        model=model,
        config=parts.config,
        noise=noise_from_config(parts.config.noise.model_dump()),
        graph=graph_from_config(parts.config.graph.model_dump()),
        path=path,
        file_hash=parts.file_hash,
        perturbation_vectors=None if vecs is None else {k: v.float() for k, v in vecs.items()},
        layout=layout,
        weights_file=parts.weights_file,
        schedule=LIBRARY_SCHEDULE if calibration is None else calibration.to_schedule(),
        calibrated=calibration is not None,
    )
