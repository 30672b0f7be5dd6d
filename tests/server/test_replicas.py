"""``sedd serve --replicas 2`` on a real local Ray cluster (``pip install -e '.[ray]'``; CI's
Ray step): both replicas serve, every response's cells equal the Python API's, the app's
promises hold behind Ray's proxy, a full service answers JSON 429s, and a killed replica is
restarted with no request lost silently."""

from __future__ import annotations

import asyncio
import json
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

pytest.importorskip("ray.serve", reason="pip install -e '.[ray]' runs these")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.anyio]

KEY = "replica-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
STEPS = 3


@dataclass
class Served:
    url: str
    process: subprocess.Popen

    def replicas(self) -> set[str]:
        text = httpx.get(f"{self.url}/metrics", headers=AUTH, timeout=30).text
        return {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("sedd_") and 'replica="' in line}  # fmt: skip


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    port = free_port()
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--replicas", "2", "--port", str(port),
            "--threads-per-replica", "1", "--precision", "fp32", "--device", "cpu",
            "--max-queued-jobs", "4", "--max-steps", "200", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, env={**os.environ, "SEDD_API_KEY": KEY})
    server = Served(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert process.poll() is None, f"sedd serve --replicas exited with {process.returncode}"
        try:
            if len(server.replicas()) == 2:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        pytest.fail("two replicas were not serving within 240 s")
    yield server
    process.send_signal(signal.SIGTERM)
    assert process.wait(120) == 0  # replicas drained, Ray shut down


def expected(seed: int) -> np.ndarray:
    """What the Python API gives for the same request (fp32, one thread, as each replica)."""
    import torch

    import sedd

    torch.set_num_threads(1)
    model = sedd.load(device="cpu", precision="fp32")
    cells = model.generate(
        1, condition=model.default_condition, steps=STEPS, seed=seed, progress=False
    )
    return cells.X.toarray()


async def test_both_replicas_serve_and_their_cells_equal_the_apis(served: Served) -> None:
    seen: dict[str, list[int]] = {}
    answers: dict[int, list] = {}
    async with httpx.AsyncClient(timeout=120, headers=AUTH) as client:
        for burst in range(8):  # until both replicas have answered
            seeds = range(4 * burst, 4 * burst + 4)
            replies = await asyncio.gather(*(
                client.post(f"{served.url}/generate", json={"steps": STEPS, "seed": s})
                for s in seeds
            ))  # fmt: skip
            for seed, reply in zip(seeds, replies, strict=True):
                assert reply.status_code == 200, reply.text
                seen.setdefault(reply.headers["x-sedd-replica"], []).append(seed)
                answers[seed] = reply.json()["counts"]
            if len(seen) == 2:
                break
    assert len(seen) == 2, seen
    for seeds in seen.values():  # one request of each replica, against the API
        np.testing.assert_array_equal(np.asarray(answers[seeds[0]]), expected(seeds[0]))


def test_the_apps_promises_hold_behind_rays_proxy(served: Served) -> None:
    assert httpx.get(f"{served.url}/healthz").status_code == 200  # no key needed
    assert httpx.get(f"{served.url}/-/healthz").status_code == 200  # Ray's probe: nor here
    rays_routes = httpx.get(f"{served.url}/-/routes")  # Ray's own route, behind the key
    assert rays_routes.status_code == 401 and rays_routes.headers["connection"] == "close"
    assert httpx.get(f"{served.url}/-/routes", headers=AUTH).status_code == 200
    keyless = httpx.post(f"{served.url}/generate", json={"steps": 1})
    assert keyless.status_code == 401 and keyless.json()["detail"].startswith("missing bearer")
    typo = httpx.post(f"{served.url}/generate", json={"conditon": "x"}, headers=AUTH)
    assert typo.status_code == 422 and typo.json()["detail"][0]["ctx"]["suggestions"]
    assert httpx.get(f"{served.url}/readyz", headers=AUTH).json()["status"] == "ready"
    with httpx.stream("POST", f"{served.url}/generate/stream", json={"steps": 2, "seed": 1},
                      headers=AUTH, timeout=120) as stream:  # fmt: skip
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line.split(": ", 1)[1] for line in stream.iter_lines()
                  if line.startswith("event: ")]  # fmt: skip
    assert events[0] == "queued" and "progress" in events and events[-1] == "result"
    assert len(served.replicas()) == 2  # /metrics covers both, labelled by replica


async def test_a_full_service_answers_json_429_with_retry_after(served: Served) -> None:
    async with httpx.AsyncClient(timeout=300, headers=AUTH) as client:
        replies = await asyncio.gather(*(
            client.post(f"{served.url}/generate", json={"steps": 150, "seed": s})
            for s in range(40)
        ))  # fmt: skip
    statuses = sorted(r.status_code for r in replies)
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses, statuses
    for reply in replies:
        if reply.status_code == 429:
            assert int(reply.headers["retry-after"]) >= 1
            assert "queue" in reply.json()["detail"]


def test_a_client_that_goes_away_has_its_job_cancelled(served: Served) -> None:
    def cancelled() -> float:
        text = httpx.get(f"{served.url}/metrics", headers=AUTH, timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("sedd_requests_total") and 'outcome="cancelled"' in line
                   and 'route="/generate"' in line)  # fmt: skip

    before = cancelled()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{served.url}/generate", json={"steps": 200, "seed": 7}, headers=AUTH,
                   timeout=2)  # fmt: skip
    deadline = time.monotonic() + 30
    while cancelled() == before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cancelled() == before + 1  # its replica dropped the job, and counted it


def _replica_pids(root: int) -> list[int]:
    """The replica processes of the server ``root`` (Ray names them after the deployment; the
    raylet of the Ray that ``root`` started is their parent): not another test run's."""
    found = subprocess.run(["pgrep", "-f", "ServeReplica:sedd"], capture_output=True, text=True)
    return [pid for pid in map(int, found.stdout.split()) if _descends_from(pid, root)]


def _descends_from(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants."""
    while pid > 1:
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # it ended
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's id
    return False


async def test_a_killed_replica_comes_back_and_no_request_is_lost_silently(
    served: Served,
) -> None:
    before = served.replicas()
    async with httpx.AsyncClient(timeout=300, headers=AUTH) as client:
        load = [asyncio.create_task(client.post(f"{served.url}/generate",
                                                json={"steps": 60, "seed": s}))
                for s in range(8)]  # fmt: skip
        await asyncio.sleep(2)
        pids = _replica_pids(served.process.pid)
        assert len(pids) == 2, pids
        os.kill(pids[0], signal.SIGKILL)
        killed_at = time.monotonic()
        replies = await asyncio.gather(*load)
    outcomes = {200: 0, 429: 0, 503: 0}
    for reply in replies:  # every request answered: its cells, or a JSON error saying to retry
        assert reply.status_code in outcomes, reply.text
        outcomes[reply.status_code] += 1
        if reply.status_code != 200:
            assert "retry" in json.loads(reply.text)["detail"]
            assert int(reply.headers["retry-after"]) >= 1
    assert sum(outcomes.values()) == 8 and outcomes[200] >= 1
    while time.monotonic() - killed_at < 60:  # Ray restarts it
        now = served.replicas()
        if len(now) == 2 and now != before:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the killed replica was not back within 60 s: {before} -> {now}")
    print(f"killed replica: {outcomes}, back after {time.monotonic() - killed_at:.1f} s")
