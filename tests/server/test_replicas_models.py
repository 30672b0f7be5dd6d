"""``sedd serve --replicas 2 --models DIR`` on a real local Ray cluster (CI's Ray step): three
models through two replicas by Ray Serve's model multiplexing. Each request reaches its model and
gets the cells that model gives alone; a model's requests go to the replica that holds it; an
unknown id is a 404; with one model a replica, Ray's LRU gives a model up without failing a
request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_client import free_port
from server_models import save_tiny_model

pytest.importorskip("ray.serve", reason="pip install -e '.[ray]' runs these")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

IDS = ("alpha", "beta", "gamma")
BODY = {"condition": "KRAS", "num_cells": 2, "steps": 4, "seed": 3}


@dataclass
class Served:
    url: str
    process: subprocess.Popen
    root: Path

    def post(self, **body: object) -> httpx.Response:
        return httpx.post(f"{self.url}/generate", json={**BODY, **body}, timeout=120)


def _repository(root: Path) -> Path:
    import torch

    from sedd.checkpoints import load_checkpoint, save_native

    for seed, model_id in enumerate(IDS):
        save_tiny_model(root / model_id, seed=seed)
        loaded = load_checkpoint(root / model_id)
        with torch.no_grad():  # weights large enough that the models' cells differ
            for p in loaded.model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed))
        save_native(loaded, root / model_id)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = _repository(tmp_path_factory.mktemp("models"))
    port = free_port()
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--replicas", "2", "--port", str(port),
            "--models", str(root), "--max-loaded-models", "2", "--threads-per-replica", "1",
            "--precision", "fp32", "--device", "cpu", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, env=dict(os.environ))
    server = Served(f"http://127.0.0.1:{port}", process, root)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert process.poll() is None, f"sedd serve exited with {process.returncode}"
        try:
            if httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        pytest.fail("the replicas were not ready within 240 s")
    yield server
    process.send_signal(signal.SIGTERM)
    assert process.wait(120) == 0


def _alone(path: Path) -> np.ndarray:
    import torch

    import sedd

    torch.set_num_threads(1)
    cells = sedd.load(path, device="cpu", precision="fp32").generate(
        2, condition="KRAS", seed=3, steps=4, progress=False
    )
    return cells.X.toarray() if hasattr(cells.X, "toarray") else np.asarray(cells.X)


def test_a_models_requests_go_to_the_replica_that_holds_it(served: Served) -> None:
    # first in the module: no replica holds beta yet, so one loads it and then holds it alone
    first = served.post(model="beta")
    assert first.status_code == 200
    time.sleep(3)  # the replica tells Ray's router which models it holds
    replicas = {served.post(model="beta").headers["x-sedd-replica"] for _ in range(6)}
    assert len(replicas) == 1, replicas


def test_each_model_answers_through_the_replicas_with_its_own_cells(served: Served) -> None:
    for model_id in IDS:
        answer = served.post(model=model_id)
        assert answer.status_code == 200, answer.text
        assert answer.json()["metadata"]["model"] == model_id
        counts = np.asarray(answer.json()["counts"])
        np.testing.assert_array_equal(counts, _alone(served.root / model_id))
    unknown = served.post(model="delta")
    assert unknown.status_code == 404 and "'alpha', 'beta', 'gamma'" in unknown.json()["detail"]


def test_rays_lru_gives_a_model_up_without_failing_a_request(served: Served) -> None:
    # two models a replica at most, three models asked in turn, twice: some replica gives one up
    answers = [served.post(model=m, seed=s) for s in (1, 2) for m in IDS]
    assert [a.status_code for a in answers] == [200] * 6
    for answer, model_id in zip(answers[3:], IDS, strict=True):
        assert answer.json()["metadata"]["model"] == model_id
