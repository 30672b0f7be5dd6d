"""On CUDA the event loop never waits for the GPU: a request is planned on the host, its labels
cross to the device once on the engine thread, and its result comes back there too. Checked on
the emulated lane (``SEDD_EMULATE_CUDA=1``), which records every CUDA op and host sync with the
thread that made it: a blocking copy on the loop would freeze ``/healthz``, streams and every
other request for up to a whole engine tick on a GPU."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from devices import needs_emulator
from server_client import make_settings, served
from server_models import save_tiny_model

from server import intake

pytestmark = [pytest.mark.anyio, needs_emulator]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("server_cuda") / "tiny")


async def test_requests_make_no_cuda_call_on_the_event_loop_thread(model_dir: Path, emulator):
    await _no_cuda_work_on_the_loop(model_dir, emulator)


async def test_a_launch_on_the_event_loop_that_does_not_sync_fails_the_lane(
    model_dir: Path, emulator, monkeypatch: pytest.MonkeyPatch
):
    """A planted bug (issue 45, item 4): a tensor made on the device while a request is planned
    on the loop. It does not sync, but on a GPU it queues behind the engine's work and holds the
    loop meanwhile; the lane counts it as a launch on the loop's thread."""
    plan_body = intake.plan_body

    def launching(*args, **kwargs):
        torch.zeros(1, device="cuda")  # e.g. labels made on the device by the route
        return plan_body(*args, **kwargs)

    monkeypatch.setattr(intake, "plan_body", launching)
    with pytest.raises(AssertionError, match="CUDA work on the event loop thread"):
        await _no_cuda_work_on_the_loop(model_dir, emulator)


async def _no_cuda_work_on_the_loop(model_dir: Path, emulator) -> None:
    loop_thread = threading.get_ident()
    async with served(make_settings(model_dir, device="cuda")) as (client, app):
        assert app.state.service.loaded.device.type == "cuda"
        before = (emulator.ops_by_thread[loop_thread], len(emulator.syncs_on(loop_thread)))
        bodies = [
            ("/generate", {"num_cells": 2, "steps": 3, "condition": "KRAS", "seed": 1}),
            ("/generate", {"conditions": {"TP53": 1, "MYC": 2}, "steps": 2}),
            (
                "/predict",
                {
                    "perturbations": ["KRAS", "TP53", "MYC"],
                    "cells_per_perturbation": 1,
                    "steps": 2,
                    "cell_type": "T",
                },
            ),
            (
                "/impute",
                {
                    "genes": ["GENE3", "GENE0"],
                    "counts": [[1, 5], [0, 2]],
                    "steps": 2,
                    "cell_conditions": ["KRAS", "BAD"],
                },
            ),
        ]
        answers = [await client.post(route, json=body) for route, body in bodies]
        streamed = await client.post("/generate/stream", json={"num_cells": 1, "steps": 2})
        after = (emulator.ops_by_thread[loop_thread], len(emulator.syncs_on(loop_thread)))
    assert [a.status_code for a in answers] == [200, 200, 200, 200], [a.text for a in answers]
    assert streamed.status_code == 200 and "event: result" in streamed.text
    site = emulator.op_sites.get(loop_thread, "")
    assert after == before, f"CUDA work on the event loop thread, first at {site}"
    counts = np.array(answers[0].json()["counts"])
    assert counts.shape == (2, 12) and counts.min() >= 0
