"""Out of accelerator memory over HTTP (issue 45, item 5): a block step that runs out with its
request alone is the server's setting, not a passing load, so it is not answered "retry later"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from server_client import make_settings, served
from server_models import save_tiny_model

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("oom") / "tiny")


def _out_of_memory_in_every_forward(app) -> None:
    def propose(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    app.state.service.engine.sampler.propose = propose


async def test_a_block_too_big_alone_is_a_500_naming_the_setting_without_retry_after(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(make_settings(model_dir)) as (client, app):
        engine = app.state.service.engine
        tokens = engine.sampler.block_rows * engine.limits.num_genes
        _out_of_memory_in_every_forward(app)
        response = await client.post("/generate", json={"num_cells": 1, "steps": 2})
    assert response.status_code == 500
    assert "Retry-After" not in response.headers
    detail = response.json()["detail"]
    assert "a retry would run out again" in detail
    assert f"lower SEDD_TOKENS_PER_FORWARD (--tokens-per-forward, now {tokens})" in detail
    logged = [r for r in caplog.records if r.name == "sedd.server" and r.levelname == "ERROR"]
    assert len(logged) == 1 and "lower --tokens-per-forward" in logged[0].getMessage()
    assert logged[0].exc_info is None  # one line, no traceback


async def test_running_out_while_packed_with_other_work_stays_retryable(model_dir: Path) -> None:
    from server.errors import http_error

    failure = http_error(torch.OutOfMemoryError("CUDA out of memory."))
    assert failure.status == 503 and "Retry-After" in failure.headers
