"""The API reference site's configuration and the packaging a user checks before adopting.

Cheap and static: mkdocs is not run here (CI's docs step runs ``scripts/build_docs.sh``, which
builds with ``--strict``). This pins what that build relies on: every page in ``mkdocs.yml``'s
nav exists and every Markdown page is in the nav, every ``::: name`` directive names something
importable, no plugin that could fetch at build time, and the license and ``py.typed`` marker.
"""

from __future__ import annotations

import importlib
import re
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DIRECTIVE = re.compile(r"^:::\s+(\S+)\s*$", re.MULTILINE)
# Plugins that build from local files only; material's social/privacy plugins download.
OFFLINE_PLUGINS = {"search", "mkdocstrings"}


def _config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _nav_pages(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def _directives() -> list[tuple[str, str]]:
    pages = sorted((DOCS / "reference").glob("*.md"))
    return [(p.name, name) for p in pages for name in DIRECTIVE.findall(p.read_text())]


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    config = _config()
    assert config["docs_dir"] == "docs"
    assert config["site_dir"] == "site"
    nav = list(_nav_pages(config["nav"]))
    assert len(nav) == len(set(nav)), nav
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"nav pages that do not exist under docs/: {missing}"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk == set(nav), f"pages not in the nav: {sorted(on_disk - set(nav))}"
    assert {"index.md", "architecture.md", "precision.md", "reference/api.md"} <= set(nav)
    # the pages the README's text moved to (tests/test_readme.py checks its links to them)
    moved = {"python.md", "cli.md", "service.md", "replicas.md", "slurm.md", "gpu.md",
             "sampler.md", "quality.md", "benchmarks.md", "layout.md"}  # fmt: skip
    assert moved <= set(nav), sorted(moved - set(nav))


def test_the_build_is_strict_and_uses_no_plugin_that_downloads() -> None:
    config = _config()
    assert config.get("strict") is True
    # a link to a missing heading is a warning, so --strict fails on it as on a missing page
    assert config["validation"]["links"]["anchors"] == "warn"
    names = {p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]}
    assert names <= OFFLINE_PLUGINS, f"plugins that may fetch at build time: {names}"
    theme = config["theme"]
    assert theme["name"] == "material" and theme.get("font") is False  # no Google Fonts
    (mkdocstrings,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict)]
    handler = mkdocstrings["handlers"]["python"]
    # the docstrings are plain prose with ``double backticks``, not Google/NumPy sections
    assert handler["options"]["docstring_style"] is None


def test_reference_pages_cover_the_public_modules() -> None:
    names = {name for _, name in _directives()}
    assert {
        "sedd.api",
        "sedd.request.plan",
        "sedd.request.imputation",
        "sedd.request.conditions",
        "sedd.engine",
        "sedd.diffusion.sampling",
        "sedd.diffusion.randomness",
        "sedd.io.write",
        "sedd.io.read",
    } <= names


@pytest.mark.parametrize(("page", "name"), _directives())
def test_every_directive_names_an_importable_object(page: str, name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        module, _, attribute = name.rpartition(".")
        assert module, f"{page}: ::: {name} is not importable"
        assert hasattr(importlib.import_module(module), attribute), f"{page}: ::: {name}"


def test_no_reference_page_lists_a_type_variable_as_public() -> None:
    """mkdocstrings lists every module attribute its ``!^_`` filter lets through: a type
    variable or ParamSpec (a typing helper, not API) must be named with a leading underscore."""
    helpers = (typing.TypeVar, typing.ParamSpec, typing.TypeVarTuple)
    listed = {
        f"{name}.{attribute}"
        for _, name in _directives()
        for attribute, value in vars(importlib.import_module(name)).items()
        if not attribute.startswith("_") and isinstance(value, helpers)
    }
    assert listed == set()


def test_the_install_line_says_what_the_readme_says_about_torch() -> None:
    """The torch pin is a version, not a build: the index picks CPU or CUDA (README)."""
    readme, index = (ROOT / "README.md").read_text(), (DOCS / "index.md").read_text()
    install = "python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ."
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu"
    for text in (readme, index):
        assert install in text and cpu_index in text
        assert "a version pin does not choose the build" in " ".join(text.split())
    assert "CPU wheel" not in index


def test_license_and_typed_marker_ship() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 the sedd authors" in license_text
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert "docs" in project["optional-dependencies"]
    # PEP 639 license strings need setuptools >= 77
    assert pyproject["build-system"]["requires"] == ["setuptools>=77"]
    assert (ROOT / "sedd" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["sedd"]


def test_a_plain_install_does_not_pull_ray() -> None:
    """Ray is the `ray` extra (`sedd serve --replicas`); one process needs none of it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("ray")]
    assert project["optional-dependencies"]["ray"] == ["ray[serve]==2.60.0"]
    plain_path = (ROOT / "server" / "app.py").read_text() + (
        ROOT / "server" / "serve.py"
    ).read_text()
    assert "replicas" not in plain_path and "import ray" not in plain_path


def test_architecture_page_names_the_reference_sampler_first() -> None:
    """The executable spec is what a new maintainer reads first: the first file the page names
    is the reference sampler, and the test that pins the engine to it is named beside it."""
    text = (DOCS / "architecture.md").read_text()
    files = re.findall(r"`((?:sedd|server|tests)/[\w/]+\.py)", text)
    assert files[0] == "sedd/diffusion/reference.py", files[:3]
    assert files[1] == "tests/engine/test_engine_equals_reference.py"
    for path in files:
        assert (ROOT / path).is_file(), path
