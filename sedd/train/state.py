"""What a training run keeps besides the raw weights, and how it goes to disk.

* ``EMA``: the fp32 exponential moving average of the weights, the model a run publishes.
* ``train_state.pt`` (``STATE_FILE``, in the run directory): everything ``resume`` needs to
  continue exactly as an uninterrupted run would (weights, EMA, optimizer, schedule, scaler, RNG
  states, config, data hash). ``write_state`` replaces it atomically; ``read_state`` refuses a
  file that is not a sedd training state, a config that may not change on resume
  (``sedd.train.config.check_resumable``) and data whose hash changed.
* ``rng_states`` / ``restore_rng_states``: the global torch (and CUDA) RNG and the noise
  generator, saved and restored together.
* ``write_native_model``: the EMA weights as a native model directory (config.json +
  safetensors), each file replaced whole so a reader never sees a half-written model.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sedd.checkpoints import CONFIG_FILE, WEIGHTS_FILE, LoadedModel, load_checkpoint, save_native
from sedd.checkpoints.schema import ModelConfig
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import Noise
from sedd.train.config import TrainConfig, check_resumable

__all__ = [
    "EMA",
    "STATE_FILE",
    "STATE_FORMAT",
    "init_weights",
    "read_state",
    "restore_rng_states",
    "rng_states",
    "write_native_model",
    "write_state",
]

STATE_FILE = "train_state.pt"
STATE_FORMAT = "sedd_train_state"


class EMA:
    """fp32 exponential moving average of a model's weights (a frozen eval-mode copy).

    Update k (1-based) uses decay min(decay, (1 + k) / (10 + k)) when ``warmup`` is on, so
    short runs are not dominated by the random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True) -> None:
        self.decay, self.warmup = decay, warmup
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, update: int) -> None:
        decay = min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay
        for shadow, param in zip(self.model.parameters(), model.parameters(), strict=True):
            shadow.lerp_(param.detach().float(), 1.0 - decay)
        for shadow, buffer in zip(self.model.buffers(), model.buffers(), strict=True):
            shadow.copy_(buffer)


def write_state(run: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``<run>/train_state.pt`` atomically (a temporary file, then a rename)."""
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / f".{STATE_FILE}.{os.getpid()}.tmp"
    try:
        torch.save(state, tmp)
        os.replace(tmp, run / STATE_FILE)
    finally:
        tmp.unlink(missing_ok=True)
    return run / STATE_FILE


def read_state(config: TrainConfig, data_hash: str) -> dict[str, Any]:
    """The saved state of ``config``'s run, checked to be resumable with ``config`` and data."""
    path = config.run_path / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"cannot resume: {path} does not exist (set run_dir / --run-dir to the run's "
            "directory, or train without --resume)."
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path} is not a sedd training state.")
    check_resumable(state["config"], config, path)
    if state["data_hash"] != data_hash:
        raise ValueError(
            f"cannot resume {path}: the data file {config.data} changed since the run "
            "started (sha256 differs)."
        )
    return state


def rng_states(generator: torch.Generator, device: torch.device) -> dict[str, Any]:
    """The global torch RNG, the noise ``generator`` and, on CUDA, every device's RNG."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "noise": generator.get_state(),
    }
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(
    states: dict[str, Any], generator: torch.Generator, device: torch.device
) -> None:
    """Undo ``rng_states``: the streams continue where the saved run left them."""
    torch.set_rng_state(states["torch"])
    generator.set_state(states["noise"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def write_native_model(
    out: Path,
    model: nn.Module,
    config: ModelConfig,
    noise: Noise,
    graph: AbsorbingGraph,
    *,
    run_path: Path,
    command: str | None,
    data_hash: str,
) -> Path:
    """``model`` (the EMA weights) as a native model directory ``out`` (config.json + weights)."""
    out.mkdir(parents=True, exist_ok=True)
    loaded = LoadedModel(
        model=model, config=config, noise=noise, graph=graph,
        path=run_path, file_hash="", layout="native",
    )  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_native(loaded, tmp, training_command=command, data_hash=data_hash)
        for name in (WEIGHTS_FILE, CONFIG_FILE):  # each file appears whole
            os.replace(tmp / name, out / name)
        os.chmod(out / WEIGHTS_FILE, 0o644)  # safetensors writes 0600; the model is public
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def init_weights(
    source: str, config: ModelConfig, model: nn.Module, ema_model: nn.Module
) -> dict[str, str]:
    """Load the weights of the model at ``source`` into ``model`` and ``ema_model`` (fine-tuning);
    refused unless it is the model ``config`` describes (same architecture, size, genes, bins and
    labels; dropout may differ). Returns the provenance record: the source and its sha256."""
    loaded = load_checkpoint(source)
    theirs = loaded.config
    if theirs.architecture != config.architecture:
        _init_mismatch(source, "architecture", theirs.architecture, config.architecture)
    mine_arch = config.arch.model_dump(exclude={"dropout"})
    theirs_arch = theirs.arch.model_dump(exclude={"dropout"})
    for key in sorted(mine_arch):
        if theirs_arch.get(key) != mine_arch[key]:
            _init_mismatch(source, f"arch.{key}", theirs_arch.get(key), mine_arch[key])
    for key in ("genes", "perturbations"):
        before, now = getattr(theirs, key), getattr(config, key)
        if list(before or []) != list(now or []):
            _init_mismatch(source, key, _names(before), _names(now))
    state = loaded.model.state_dict()
    model.load_state_dict(state)
    ema_model.load_state_dict(state)
    return {"source": str(source), "sha256": loaded.file_hash}


def _names(names: Any) -> str:
    names = list(names or [])
    head = ", ".join(map(str, names[:3])) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} names [{head}]"


def _init_mismatch(source: str, field: str, theirs: Any, mine: Any) -> None:
    raise ValueError(
        f"init_from: {source} has {field} {theirs}, but this run builds {mine}; fine-tune only a "
        "model of the same genes, bins, labels and size (or drop init_from to train from scratch)."
    )
