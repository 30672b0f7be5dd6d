"""Tiny native models for the server tests: a conditional st3 model with cell types, saved with
``sedd.checkpoints.save_native`` so the app loads it like any checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from sedd.checkpoints import LoadedModel, build_model, save_native
from sedd.checkpoints.schema import ModelConfig
from sedd.diffusion.graph import graph_from_config
from sedd.diffusion.noise import noise_from_config

GENES = [f"GENE{i}" for i in range(12)]
PERTURBATIONS = ["ctrl", "KRAS", "TP53", "MYC", "BAD"]
CELL_TYPES = ["T", "B"]
NUM_BINS = 6


def tiny_config() -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "architecture": "st3_perturbation",
            "arch": {
                "num_genes": len(GENES),
                "num_bins": NUM_BINS,
                "num_perturbations": len(PERTURBATIONS),
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "num_cell_types": len(CELL_TYPES),
            },
            "genes": GENES,
            "perturbations": PERTURBATIONS,
            "control_label": "ctrl",
            "cell_types": CELL_TYPES,
        }
    )


def save_tiny_model(
    dst: Path, *, nan_label: str | None = None, seed: int = 0, overflow: bool = False
) -> Path:
    """Write the tiny model to ``dst``; ``nan_label``'s embedding row is NaN (its cells fail).

    With ``overflow`` that row is finite but huge (3e38): the weights load, and the forward
    overflows to Inf/NaN for that label only.
    """
    torch.manual_seed(seed)
    config = tiny_config()
    model = build_model(config).eval()
    if nan_label is not None:
        with torch.no_grad():
            bad = 3e38 if overflow else float("nan")
            model.pert_embed.weight[PERTURBATIONS.index(nan_label)] = bad
    loaded = LoadedModel(
        model=model,
        config=config,
        noise=noise_from_config(config.noise.model_dump()),
        graph=graph_from_config(config.graph.model_dump()),
        path=dst,
        file_hash="",
    )
    return save_native(loaded, dst)
