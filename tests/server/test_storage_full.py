"""A full temporary directory (issue "Hardening, round 5", item 8): an ``.h5ad`` answer used
to be a 500 "internal error (OSError)" with a traceback in the log. It is a 507 with
Retry-After, a one-line detail that says to retry or ask for JSON, and one log line."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_client import make_settings, serve_subprocess, served
from server_models import save_tiny_model
from tmpfs import mounted_tmpfs

import server.encoding

pytestmark = pytest.mark.anyio
BODY = {"num_cells": 2, "steps": 2, "seed": 0, "format": "h5ad"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("storage") / "tiny")


def _check_507(response: httpx.Response) -> None:
    assert response.status_code == 507, response.text
    assert response.headers["retry-after"] == "30"
    detail = response.json()["detail"]
    assert detail.startswith("no room for this .h5ad answer in the server's temporary directory")
    assert "No space left on device" in detail and "(format: json)" in detail


async def test_a_full_disk_is_a_507_with_retry_after_and_one_log_line(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(*args: object, **kwargs: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", "cells.h5ad")

    async with served(make_settings(model_dir)) as (client, _):
        assert (await client.post("/generate", json=BODY)).status_code == 200
        monkeypatch.setattr(server.encoding, "write_cells_h5ad", full)
        with caplog.at_level(logging.WARNING):
            response = await client.post("/generate", json=BODY)
        as_json = await client.post("/generate", json={**BODY, "format": "json"})
    _check_507(response)
    assert as_json.status_code == 200  # JSON needs no disk
    logged = [r for r in caplog.records if "no room for this .h5ad answer" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is None  # one line, no traceback


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, filled (skipped where none can be mounted: not root)."""
    with mounted_tmpfs(tmp_path, "1m", filler_bytes=2**20 - 4096) as mount:
        yield mount


@pytest.mark.slow
def test_a_real_full_tmpdir_is_a_507_over_real_http(model_dir: Path, full_tmpfs: Path) -> None:
    flags = ["--model", str(model_dir), "--precision", "fp32", "--device", "cpu"]
    with serve_subprocess(*flags, TMPDIR=str(full_tmpfs)) as url:
        response = httpx.post(f"{url}/generate", json=BODY, timeout=60)
        as_json = httpx.post(f"{url}/generate", json={**BODY, "format": "json"}, timeout=60)
    _check_507(response)
    assert as_json.status_code == 200
