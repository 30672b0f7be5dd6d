"""The package carries its bundled model and data (package data, found with importlib.resources),
so ``sedd.load()``, ``sedd serve`` and ``sedd generate`` work from a wheel outside the checkout
(CI builds and installs the wheel: ``.ci/wheel.sh``); the checkout's ``models/pbmc_default``
and ``data/`` point at the same files."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import sedd
from sedd.defaults import BUNDLED_DATA, DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(sedd.__file__).parent


def _package_data() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]["sedd"]


def test_the_default_model_and_data_live_inside_the_package() -> None:
    assert DEFAULT_MODEL.is_relative_to(PACKAGE) and BUNDLED_DATA.is_relative_to(PACKAGE)
    for needed in ("config.json", "model.safetensors", "calibration.json"):
        assert (DEFAULT_MODEL / needed).is_file(), needed
    assert BUNDLED_DATA.is_file()


def test_the_wheel_takes_every_file_loading_reads_and_no_reports() -> None:
    patterns = _package_data()
    shipped = [
        DEFAULT_MODEL / name for name in ("config.json", "model.safetensors", "calibration.json")
    ] + [BUNDLED_DATA, BUNDLED_DATA.with_name("pbmc68k_split.json")]
    for path in shipped:
        relative = str(path.relative_to(PACKAGE))
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} not shipped"
    reports = [p for p in (DEFAULT_MODEL / "quality").rglob("*") if p.is_file()]
    for path in reports:
        relative = str(path.relative_to(PACKAGE))
        assert not any(fnmatch.fnmatch(relative, p) for p in patterns), relative


def test_the_checkouts_paths_point_at_the_packaged_files() -> None:
    assert (ROOT / "models" / "pbmc_default").resolve() == DEFAULT_MODEL.resolve()
    assert (ROOT / "data" / BUNDLED_DATA.name).resolve() == BUNDLED_DATA.resolve()
    assert not (PACKAGE / "bundled" / "pbmc_v1").exists()  # the old model stays out of it
