"""Paths of what ships with the package (no heavy imports: the CLI's parser reads these)."""

from __future__ import annotations

from pathlib import Path

# The repository root when installed from a checkout (`pip install -e .`): models/ and data/.
ROOT = Path(__file__).resolve().parents[1]
# The model served and sampled when no path is given: the bundled PBMC model.
DEFAULT_MODEL = ROOT / "models" / "pbmc_default"
# The bundled real counts (PBMC 68k reduced, 700 cells x 765 genes) the default model trained on.
BUNDLED_DATA = ROOT / "data" / "pbmc68k_counts.h5ad"
