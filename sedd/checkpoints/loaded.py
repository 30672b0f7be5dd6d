"""What every checkpoint layout reader shares: the loaded model, the parts a reader hands back,
strict weight matching, building a network from its config, and the label errors.

The layout readers (``native``, ``st3``, ``reference``) import this module and nothing above it;
``sedd.checkpoints.load`` picks the reader.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ValidationError
from torch import nn

from sedd.checkpoints.io import CheckpointError, read_json
from sedd.checkpoints.schema import ModelConfig
from sedd.defaults import LIBRARY_SCHEDULE, Schedule
from sedd.diffusion.graph import Graph
from sedd.diffusion.noise import Noise
from sedd.models.ddit import DDiT
from sedd.models.st3 import SEDDPerturbationTransformer, SEDDTransformer

Layout = Literal["native", "st3", "sedd_hf", "sedd_run"]
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
VECTORS_FILE = "perturbation_vectors.safetensors"


class UnknownLabelError(ValueError):
    """A label (perturbation or condition) or cell-type name the model does not know;
    ``suggestions`` are close ones."""

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
    # name -> (E,) on the CPU: labels are planned on the host and cross to the device once, at
    # job start (a planning call on a server's event loop must never wait for the GPU)
    perturbation_vectors: dict[str, torch.Tensor] | None = None
    layout: Layout = "native"
    weights_file: Path | None = None
    # what a request that names no schedule runs: the model's calibration (calibration.json,
    # ``sedd calibrate``), else the library's tuned default
    schedule: Schedule = LIBRARY_SCHEDULE
    calibrated: bool = False  # the schedule is the model's own

    @property
    def conditional(self) -> bool:
        """Whether the model is conditioned on perturbations (by index or by vector): the one
        rule every front door asks."""
        return self.config.num_perturbations > 0

    @property
    def conditions(self) -> list[str]:
        """The condition names it takes: its label list, else its vector file's names ([] for an
        unconditional model, or one whose names were not given)."""
        if not self.conditional:
            return []
        if self.config.perturbations is not None:
            return [name for name in self.config.perturbations if name is not None]
        return list(self.perturbation_vectors or {})

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
        hint = "Pass the training label mapping with --perturbation-map FILE."
        raise UnknownLabelError(name, self.label_word, self.conditions, hint)

    @property
    def label_word(self) -> str:
        """What the model's labels are called in messages: "perturbation" for perturbation
        models, "condition" for the rest (cell types, other labels)."""
        return "perturbation" if self.config.label_kind == "perturbation" else "condition"

    def cell_type_index(self, name: str) -> int:
        names = self.config.cell_types or []
        if name in names:
            return names.index(name)
        raise UnknownLabelError(name, "cell type", names)

    def perturbation_labels(self, names: Sequence[str]) -> torch.Tensor:
        """Model input for perturbation ``names``, on the CPU: vectors (B, E) when the model has
        a vector file, else indices (B,). The engine moves a job's labels to the device once."""
        if self.perturbation_vectors is not None:
            missing = [n for n in names if n not in self.perturbation_vectors]
            if missing:
                known = list(self.perturbation_vectors)
                raise UnknownLabelError(missing[0], self.label_word, known)
            return torch.stack([self.perturbation_vectors[n] for n in names])  # (B, E)
        indices = [self.label_index(n) for n in names]
        return torch.tensor(indices, dtype=torch.long)  # (B,)

    def cell_type_labels(self, names: Sequence[str]) -> torch.Tensor:
        """Cell-type indices (B,) of ``names``, on the CPU (as ``perturbation_labels``)."""
        indices = [self.cell_type_index(n) for n in names]
        return torch.tensor(indices, dtype=torch.long)  # (B,)


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


def check_state(expected: Mapping[str, Any], state: Mapping[str, Any], parts: SourceParts) -> None:
    """Every key of ``expected`` (name -> tensor, e.g. a meta-device model's state dict) must be
    in ``state`` with the same shape, and nothing else; every weight must be finite."""
    file = parts.weights_file
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
    integral = [k for k in expected if not state[k].is_floating_point()]
    if integral:
        kinds = sorted({str(state[k].dtype).removeprefix("torch.") for k in integral})
        raise CheckpointError(
            f"{file}: weights that are not floating point ({', '.join(kinds)}) in "
            f"{_listing(integral)}; a trained model's weights are floats. Check that this is the "
            "model's checkpoint, or convert its weights to float32."
        )
    bad = [k for k in expected if not state[k].isfinite().all()]
    if bad:
        raise CheckpointError(
            f"{file}: non-finite weights (NaN or Inf) in {_listing(bad)}; the checkpoint is "
            "corrupt or diverged in training. Pick an earlier checkpoint."
        )


def build_checked_model(parts: SourceParts) -> nn.Module:
    """The network ``parts.config`` describes, holding ``parts.state``.

    The shapes are checked on a meta-device model first, so a config with huge dimensions is
    refused before anything is allocated.
    """
    try:
        with torch.device("meta"):
            skeleton = build_model(parts.config)
    except ValueError as err:
        raise CheckpointError(f"{parts.described_by} describes an invalid model: {err}") from None
    check_state(skeleton.state_dict(), parts.state, parts)
    model = build_model(parts.config)
    model.load_state_dict(parts.state, strict=True)  # copies (and casts) into fp32 parameters
    return model


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
        raise CheckpointError(f"{path} is not a valid model config: {problems(err)}") from None


def problems(err: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
        for e in err.errors()
    )
