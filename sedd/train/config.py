"""What a training run is: ``TrainConfig``, the data it names, the model it describes, the LR
schedule and precision it implies.

``TrainConfig`` is the JSON file behind ``sedd train --config FILE``. Every field has a default,
so a config written by an older sedd (missing newer fields) still loads. Unknown keys are refused,
which catches typos. Relative paths (``data``, ``out``, ``run_dir``) written in a config file are
relative to that file's directory (so a config works from any working directory); given on the
command line, they are relative to the working directory. Without any, ``data`` is the bundled
PBMC counts and the run directory (``train_state.pt``, ``metrics.jsonl``) is ``<out>/training``.

``load_training_data`` reads the counts (``sedd.io.read.read_counts``), splits train /
held-out cells by an obs column, and turns counts into tokens (``sedd.io.tokens.counts_to_tokens``):
count c is token c for c < num_bins, and token num_bins is the mask. ``model_config`` then
builds the native ``ModelConfig`` (gene names, label vocabulary, tokens, graph, noise) that
``sedd.checkpoints.load_checkpoint`` reads back.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sedd.checkpoints.schema import (
    RESERVED_OBS_COLUMNS,
    GraphConfig,
    LabelKind,
    LogLinearNoiseConfig,
    ModelConfig,
    Provenance,
    ST3Arch,
    ST3PerturbationArch,
    TokenConfig,
)
from sedd.defaults import BUNDLED_DATA
from sedd.io.files import sha256_file
from sedd.io.read import read_counts
from sedd.io.tokens import CountClipWarning, counts_to_tokens
from sedd.precision import PrecisionError, PrecisionPolicy, resolve_precision

__all__ = [
    "RESUME_MAY_CHANGE",
    "ArchSettings",
    "TrainConfig",
    "TrainingData",
    "check_resumable",
    "load_train_config",
    "load_training_data",
    "lr_factor",
    "model_config",
    "training_precision",
]

# Fields a resumed run may change; any other difference from the saved run is refused, because
# the weights, optimizer state or data stream would no longer match the configuration. The LR
# schedule's shape may change (a second phase at a flat rate, say), not the base rate.
RESUME_MAY_CHANGE = frozenset(
    {
        "max_steps",
        "schedule",
        "warmup_steps",
        "min_lr_ratio",
        "log_every",
        "checkpoint_every",
        "val_every",
        "val_repeats",
        "out",
        "run_dir",
        "notes",
        "device",
    }
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArchSettings(_Strict):
    """The network's size; genes, bins and labels come from the data."""

    hidden_dim: int = Field(default=128, ge=2)
    num_layers: int = Field(default=4, ge=1)
    num_heads: int = Field(default=4, ge=1)
    ff_mult: int = Field(default=4, ge=1)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)


class TrainConfig(_Strict):
    """A training run. Steps count optimizer updates (``accum_steps`` micro-batches each)."""

    # data
    data: str = str(BUNDLED_DATA)
    layer: str | None = None  # read counts from this layer instead of .X
    recover: Literal["pbmc"] | None = None  # rebuild counts from log1p .raw.X (read_counts)
    condition_key: str | None = "bulk_labels"  # obs column of labels; None: unconditional
    # what the labels are; recorded in the model config with condition_key as its label_key
    label_kind: LabelKind = "cell_type"
    control_label: str | None = None  # recorded in the model config; must be one of the labels
    split_key: str | None = "split"  # obs column that selects cells; None: train on every cell
    train_split: str = "train"
    val_split: str | None = "test"  # held-out cells for the validation loss; None: none
    num_bins: int | None = Field(default=None, ge=1)  # None: max training count + 1
    clip_counts: bool = False  # clip counts >= num_bins to num_bins - 1 instead of refusing
    # model and objective
    arch: ArchSettings = Field(default_factory=ArchSettings)
    # fine-tuning: a model (any layout load_checkpoint reads) whose weights start the run; its
    # genes, bins, labels and size must equal the data's and arch's. None: random init
    init_from: str | None = None
    objective: Literal["elbo", "masked_ce"] = "elbo"
    noise_eps: float = Field(default=1e-3, gt=0.0, lt=1.0)  # log-linear schedule eps
    t_eps: float = Field(default=1e-3, gt=0.0, lt=1.0)  # t ~ U(t_eps, 1)
    # optimisation
    lr: float = Field(default=1e-3, gt=0.0)
    weight_decay: float = Field(default=0.01, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["cosine", "constant"] = "cosine"  # after linear warmup
    warmup_steps: int = Field(default=100, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)  # cosine floor, a fraction of lr
    max_steps: int = Field(default=1000, ge=1)
    batch_size: int = Field(default=32, ge=1)  # cells per micro-batch
    accum_steps: int = Field(default=1, ge=1)  # micro-batches per optimizer step
    grad_clip: float | None = Field(default=1.0, gt=0.0)  # max grad norm; None: no clipping
    amp: Literal["bf16", "fp16", "fp32"] = "fp32"
    activation_checkpointing: bool = False
    ema_decay: float = Field(default=0.999, ge=0.0, lt=1.0)
    ema_warmup: bool = True  # decay min(ema_decay, (1 + k) / (10 + k)) at update k
    # bookkeeping
    seed: int = Field(default=0, ge=0)
    device: str | None = None  # None: cuda if available, else cpu
    checkpoint_every: int = Field(default=500, ge=1)  # optimizer steps
    log_every: int = Field(default=10, ge=1)
    val_every: int | None = Field(default=None, ge=1)  # None: only at the end
    val_repeats: int = Field(default=1, ge=1)  # passes over the held-out cells (fresh t, masks)
    out: str = "models/sedd"  # native model directory (EMA weights)
    run_dir: str | None = None  # train_state.pt + metrics.jsonl; None: <out>/training
    notes: str = ""  # free text, kept in the model's provenance

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path(self.out) / "training"


def load_train_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Read a config JSON (or start from defaults) and apply non-``None`` ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training config {path} does not exist.")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}.") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object of training settings.")
        # paths are relative to the config file, not the cwd
        for key in ("data", "out", "run_dir", "init_from"):
            value = data.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                data[key] = os.path.normpath(path.parent / value)
    data.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in err.errors()
        )
        raise ValueError(f"invalid training config {path or '(defaults)'}: {problems}") from None


def check_resumable(saved: dict[str, Any], config: TrainConfig, path: Path) -> None:
    """Refuse to resume the run saved with config ``saved`` under a different ``config``."""
    before = TrainConfig.model_validate(saved).model_dump(mode="json")  # fills newer defaults
    now = config.model_dump(mode="json")
    for settings in (before, now):  # dropout has no weights: a resumed run may change it
        settings["arch"] = {k: v for k, v in settings["arch"].items() if k != "dropout"}
    changed = sorted(k for k in now if k not in RESUME_MAY_CHANGE and before[k] != now[k])
    if changed:
        diffs = "; ".join(f"{k}: {before[k]!r} -> {now[k]!r}" for k in changed)
        raise ValueError(
            f"cannot resume {path} with a different configuration ({diffs}); only "
            f"{sorted(RESUME_MAY_CHANGE)} and arch.dropout may change. Start a new run_dir "
            "instead."
        )


def lr_factor(
    update: int, *, warmup: int, max_steps: int, schedule: str, min_ratio: float
) -> float:
    """LR multiplier of optimizer update ``update`` (0-based): linear warmup, then cosine/flat.

    Warmup reaches the full rate at update ``warmup - 1``; the cosine then decays to
    ``min_ratio`` at update ``max_steps``.
    """
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (update - warmup) / max(1, max_steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def training_precision(amp: str, device: torch.device) -> PrecisionPolicy:
    """The autocast policy of a training run; fp16 only on CUDA (it needs the GradScaler)."""
    if amp == "fp16" and device.type != "cuda":
        raise PrecisionError(
            f"amp 'fp16' training needs CUDA (fp16 kernels and a GradScaler); on device "
            f"{device} use amp 'bf16' or 'fp32' instead."
        )
    return resolve_precision(amp, device)


@dataclass
class TrainingData:
    """Tokens of the training and held-out cells, with everything the model config records."""

    tokens: torch.Tensor  # (N, G) int64 training cells
    labels: torch.Tensor | None  # (N,) int64 label indices; None: unconditional
    val_tokens: torch.Tensor | None  # (M, G) held-out cells
    val_labels: torch.Tensor | None  # (M,)
    genes: list[str]  # model order = the file's var_names
    label_names: list[str] | None  # sorted; label_names[i] is label index i
    num_bins: int
    data_hash: str  # sha256 of the data file
    val_clipped: int = 0  # held-out counts clipped to num_bins - 1

    @property
    def num_genes(self) -> int:
        return int(self.tokens.shape[1])


def load_training_data(config: TrainConfig) -> TrainingData:
    """Read, split and tokenize the cells ``config`` names."""
    path = Path(config.data)
    adata = read_counts(path, layer=config.layer, recover=config.recover)
    genes = [str(g) for g in adata.var_names]
    train_rows, val_rows = _split_rows(adata.obs, config)
    counts = adata.X
    train_counts, val_counts = counts[train_rows], counts[val_rows]
    max_count = int(train_counts.max()) if train_counts.shape[0] else 0
    num_bins = config.num_bins or max_count + 1
    tokens = counts_to_tokens(train_counts, num_bins, genes=genes, clip=config.clip_counts)
    val_tokens, val_clipped = None, 0
    if len(val_rows):
        with warnings.catch_warnings():
            # held-out cells may exceed the training range; clipping them is recorded instead
            warnings.simplefilter("ignore", CountClipWarning)
            val = counts_to_tokens(val_counts, num_bins, genes=genes, clip=True)
        val_tokens, val_clipped = val.tokens, val.n_clipped
    labels = val_labels = label_names = None
    if config.condition_key is not None:
        values = adata.obs[config.condition_key].astype(str).to_numpy()
        label_names = sorted(set(values.tolist()))
        index = {name: i for i, name in enumerate(label_names)}
        codes = torch.tensor([index[v] for v in values], dtype=torch.long)
        labels = codes[torch.from_numpy(train_rows)]
        val_labels = codes[torch.from_numpy(val_rows)] if len(val_rows) else None
        if config.control_label is not None and config.control_label not in index:
            raise ValueError(
                f"control_label {config.control_label!r} is not one of the "
                f"{config.condition_key!r} labels {label_names[:10]}; pass one of them or null."
            )
    return TrainingData(
        tokens=tokens.tokens,
        labels=labels,
        val_tokens=val_tokens,
        val_labels=val_labels,
        genes=genes,
        label_names=label_names,
        num_bins=num_bins,
        data_hash=sha256_file(path),
        val_clipped=val_clipped,
    )


def _split_rows(obs: Any, config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the training and held-out cells."""
    for key in (config.condition_key, config.split_key):
        if key is not None and key not in obs:
            raise ValueError(
                f"obs column {key!r} not found in {config.data}; obs columns are "
                f"{list(obs.columns)}. Set condition_key / split_key to one of them (or null)."
            )
    if config.split_key is None:
        return np.arange(len(obs)), np.arange(0)
    split = obs[config.split_key].astype(str).to_numpy()
    train_rows = np.flatnonzero(split == config.train_split)
    if not len(train_rows):
        raise ValueError(
            f"no cells have obs[{config.split_key!r}] == {config.train_split!r} in {config.data}; "
            f"values there: {sorted(set(split.tolist()))[:10]}."
        )
    val_rows = np.arange(0)
    if config.val_split is not None:
        val_rows = np.flatnonzero(split == config.val_split)
    return train_rows, val_rows


def model_config(
    config: TrainConfig, data: TrainingData, provenance: dict[str, Any] | None = None
) -> ModelConfig:
    """The native config of the model ``config`` trains on ``data`` (st3 x0 architecture)."""
    num_bins, arch = data.num_bins, config.arch
    common = {
        "num_genes": data.num_genes,
        "num_bins": num_bins,
        "hidden_dim": arch.hidden_dim,
        "num_layers": arch.num_layers,
        "num_heads": arch.num_heads,
        "ff_mult": arch.ff_mult,
        "dropout": arch.dropout,
    }
    conditional = data.label_names is not None
    model_arch: ST3Arch | ST3PerturbationArch = (
        ST3PerturbationArch(**common, num_perturbations=len(data.label_names or []))
        if conditional
        else ST3Arch(**common)
    )
    return ModelConfig(
        architecture="st3_perturbation" if conditional else "st3",
        arch=model_arch,
        parametrisation="x0",
        graph=GraphConfig(type="absorb", dim=num_bins + 1),
        noise=LogLinearNoiseConfig(eps=config.noise_eps),
        tokens=TokenConfig(num_bins=num_bins, mask_index=num_bins, vocab_size=num_bins + 1),
        genes=data.genes,
        perturbations=data.label_names,
        control_label=config.control_label if conditional else None,
        # a key such as "condition" is already a column of generated cells: no second copy
        label_key=(
            config.condition_key
            if conditional and config.condition_key not in RESERVED_OBS_COLUMNS
            else None
        ),
        label_kind=config.label_kind,
        provenance=Provenance(
            source=config.data,
            source_format="sedd_train",
            data_hash=data.data_hash,
            ema=True,
            training_args=config.model_dump(mode="json"),
            **(provenance or {}),
        ),
    )
