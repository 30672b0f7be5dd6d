"""Every path a docstring quotes resolves: a repository file (``sedd/...``, ``tests/...``,
``scripts/...``, ...) exists, and a dotted name in double backticks (``sedd.x.y``,
``server.x``) imports. A renamed module or test cannot leave a docstring pointing at nothing.
Upstream paths are written with a placeholder root (``<st3>/scripts/...``) and not checked."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = "sedd|server|tests|scripts|docs|slurm|models|data|configs|\\.ci"
# a repository path: not part of a longer path (<st3>/scripts/... is upstream), not a glob
FILE = re.compile(rf"(?<![\w./<>-])((?:{TOP})/[\w./-]*\w)(?![\w*<{{])")
DOTTED = re.compile(r"``((?:sedd|server)(?:\.\w+)+)``")


def _docstrings() -> Iterator[tuple[Path, str]]:
    files = [*ROOT.glob("sedd/**/*.py"), *ROOT.glob("server/**/*.py"), *ROOT.glob("scripts/*.py")]
    for path in sorted(files):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            if isinstance(node, kinds) and (doc := ast.get_docstring(node, clean=False)):
                yield path, doc


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_file_a_docstring_quotes_exists() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {quoted}"
        for path, doc in _docstrings()
        for quoted in (m.group(1).rstrip(".") for m in FILE.finditer(doc))
        if not (ROOT / quoted.split("::")[0]).exists()
    )
    assert not missing, "docstrings quote files that do not exist:\n" + "\n".join(missing)


def test_every_dotted_name_a_docstring_quotes_imports() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path, doc in _docstrings()
        for name in DOTTED.findall(doc)
        if not _resolves(name)
    )
    assert not missing, "docstrings quote names that do not import:\n" + "\n".join(missing)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    assert _resolves("sedd.run.run_plan") and not _resolves("sedd.run.generate")
    quoted = [m.group(1) for m in FILE.finditer(
        "see ``tests/diffusion/test_reference.py``, ``scripts/inference_*.py`` and "
        "``<st3>/scripts/evals/perturbed_pseq.py``"
    )]  # fmt: skip
    assert quoted == ["tests/diffusion/test_reference.py"]
