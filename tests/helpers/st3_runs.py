"""Commands as an st3 user runs them, in their own process: ``run(argv, **env)`` from the
repository root with this environment's ``sedd`` (``$SEDD``) and no SLURM variables of the
test's own; ``job(script, **env)`` runs ``scripts/<script>`` (a job script) that way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEDD = Path(sys.executable).parent / "sedd"


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base.update(SEDD=str(SEDD), PYTHONWARNINGS="ignore", **env)
    return subprocess.run(argv, env=base, capture_output=True, text=True, cwd=ROOT,
                          timeout=300, check=False)  # fmt: skip


def job(script: str, *words: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run(["bash", str(ROOT / "scripts" / script), *words], **env)
