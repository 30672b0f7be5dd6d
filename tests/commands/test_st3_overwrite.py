"""st3's scripts never lose a result: a second run into the same place is refused (nothing
changes on disk) unless ``--overwrite``, and the metadata then describes the new cells."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import anndata
import pytest

from sedd.commands.st3_scripts import inference_conditional
from sedd.io.files import sha256_file

pytestmark = pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
ROOT = Path(__file__).resolve().parents[2]
ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"


def test_a_second_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    exp = tmp_path / "tiny_pert"
    shutil.copytree(ST3 / "tiny_pert", exp)
    base = ["--experiment_dir", str(exp), "--num_samples_per_pert", "1", "--num_steps", "2",
            "--precision", "fp32"]  # fmt: skip
    assert inference_conditional([*base, "--seed", "1"]) == 0
    out = exp / "inference_results" / "generated_cells.h5ad"
    meta = exp / "inference_results" / "generation_metadata.json"
    first, first_meta = sha256_file(out), meta.read_text()
    with pytest.raises(FileExistsError, match=r"generated_cells.h5ad exists .* --overwrite"):
        inference_conditional([*base, "--seed", "2"])
    assert sha256_file(out) == first and meta.read_text() == first_meta  # nothing lost
    # the script file: one line, exit 2, no traceback
    script = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "inference_conditional.py"), *base, "--seed", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert script.returncode == 2 and "Traceback" not in script.stderr
    assert "inference_conditional.py: error:" in script.stderr and "--overwrite" in script.stderr
    assert sha256_file(out) == first
    assert inference_conditional([*base, "--seed", "2", "--overwrite"]) == 0
    assert sha256_file(out) != first
    assert json.loads(meta.read_text())["request"]["seed"] == 2
    assert set(anndata.read_h5ad(out).obs["seed"]) == {2}
