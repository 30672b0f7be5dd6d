"""docs/upstream.md lists every upstream flag, YAML key, job-script variable and model family
that sedd reads: the table is checked against the code, so it cannot fall behind it."""

from __future__ import annotations

import re
from pathlib import Path

from sedd.checkpoints.st3_families import UpstreamClass
from sedd.commands.st3_flags import flags_for

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "upstream.md").read_text()
SCRIPTS = {
    "conditional": "scripts/inference_conditional.py",
    "generation": "scripts/inference_generation.py",
    "perturbseq": "scripts/inference_perturbseq.py",
    "imputation": "scripts/inference_imputation.py",
    "celltype": "scripts/inference_celltype_perturbseq.py",
}


def _section(script_path: str) -> str:
    """The flag table of one script: from its heading to the next heading."""
    start = PAGE.index(f"### `{script_path}`")
    end = PAGE.find("\n#", start + 1)
    return PAGE[start : end if end != -1 else None]


def test_every_flag_and_yaml_key_of_every_script_is_in_its_table() -> None:
    for script, path in SCRIPTS.items():
        table = _section(path)
        for flag in flags_for(script):  # type: ignore[arg-type]
            row = next((r for r in table.splitlines() if r.startswith(f"| `{flag.flag}` |")), None)
            assert row is not None, f"{path}: {flag.flag} missing from docs/upstream.md"
            for section, key in flag.yaml:
                assert f"`{section}.{key}`" in row, f"{path} {flag.flag}: {section}.{key}"
            assert ("noted" in row) == bool(flag.noted), f"{path} {flag.flag}: noted or not"


def test_every_job_script_variable_is_in_the_variable_table() -> None:
    variables: set[str] = set()
    for script in ROOT.glob("scripts/inf*.sh"):  # inf_*.sh and inference_*celltype*.sh
        header = [line for line in script.read_text().splitlines() if line.startswith("#   ")]
        variables |= {m.group(1) for line in header if (m := re.match(r"#   ([A-Z][A-Z_]+)", line))}
    table = PAGE[PAGE.index("## Job-script variables") :]
    missing = sorted(v for v in variables if f"`{v}`" not in table)
    assert not missing, f"job-script variables missing from docs/upstream.md: {missing}"
    assert "PERTURBATIONS_ALL_FILE" in variables


def test_every_upstream_family_is_in_the_family_table() -> None:
    table = PAGE[PAGE.index("## Model families") : PAGE.index("## Label files")]
    for name in ("SEDDTransformer", "SEDDPerturbationTransformer",
                 "SEDDPerturbationTransformerSeparateFiLM",
                 "SEDDCellTypePerturbationTransformer"):  # fmt: skip
        UpstreamClass(name).family  # noqa: B018 - a class sedd builds
        assert f"`{name}`" in table
