"""Checkpoint fixtures on disk for the checkpoint tests, and helpers to copy and damage them.

``ST3`` holds tiny st3 experiments, ``REF`` tiny reference SEDD models and training runs, with
the outputs their upstream code computed (``io_fixture.pt``, ``scores.pt``).
"""

from __future__ import annotations

import pathlib
import shutil
from pathlib import Path
from typing import Any

import torch

DATA = Path(__file__).resolve().parents[1] / "data"
ST3 = DATA / "st3" / "experiments"
REF = DATA / "sedd_reference"
UPSTREAM = DATA / "upstream"  # aivc-dcm and st3's cell-type family (scripts/make_upstream_fixtures)
ST3_ATOL = 1e-6  # st3 logits are ~1e-3 in size (N(0, 0.02) init); see test_model_parity.py
REF_ATOL = 1e-5


def load_io(root: Path = DATA / "st3") -> dict[str, torch.Tensor]:
    """Inputs of the fixtures under ``root`` (default st3's; ``UPSTREAM``) and the outputs the
    upstream code computed from them."""
    return torch.load(root / "io_fixture.pt", weights_only=True)


def copy_tree(src: Path, dst: Path) -> Path:
    """Copy with fresh (writable) permissions; the fixtures are read-only."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dst


def gene_file(tmp_path: Path, n: int = 64, name: str = "genes.txt") -> Path:
    """A gene list ``GENE0`` .. ``GENE{n-1}``, one name a line."""
    path = tmp_path / name
    path.write_text("\n".join(f"GENE{i}" for i in range(n)) + "\n")
    return path


class TouchOnUnpickle:
    """Unpickling this object calls Path.touch(marker): a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))
