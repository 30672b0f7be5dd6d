"""Is a 429's Retry-After honest? Each one against the time the queue really took to move.

Starts ``sedd serve`` (real uvicorn, the bundled model unless ``--model``) with a queue of one
and two requests running at a time (``--max-rows-per-forward 2``), then for each load shape:
sends three requests (two run, one waits), then a fourth, which is refused with a 429. It then
polls ``/readyz`` (every ``--poll-s``) until the waiting request has started, and prints the
429's ``Retry-After`` next to the seconds that really took.

    .venv/bin/python scripts/bench_retry_after.py

``Retry-After`` is whole seconds, rounded up (RFC 9110), so it reads up to 1 s long; the poll
adds up to ``--poll-s`` to the measured wait.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sedd.defaults import DEFAULT_MODEL

SHAPES = ((4, 20), (2, 40), (4, 10), (3, 30))  # cells x steps of every request in one round


def start_server(model: Path, port: int) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "sedd.cli", "serve", "--model", str(model), "--port", str(port),
        "--precision", "fp32", "--device", "cpu", "--max-rows-per-forward", "2",
        "--max-queued-jobs", "1", "--max-cells-per-request", "4", "--max-steps", "60",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sedd serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("sedd serve was not ready within 120 s")


async def one_shape(
    client: httpx.AsyncClient, url: str, cells: int, steps: int, poll_s: float
) -> tuple[int, str | None, float]:
    """(status of the fourth request, its Retry-After, seconds until the queue moved)."""
    body = {"num_cells": cells, "steps": steps}
    running = []
    for seed in range(3):  # two start, one waits
        running.append(asyncio.ensure_future(client.post(f"{url}/generate",
                                                         json={**body, "seed": seed})))  # fmt: skip
        await asyncio.sleep(0.3)
    await asyncio.sleep(1.0)
    refused = await client.post(f"{url}/generate", json={**body, "seed": 9})
    began = time.monotonic()
    while (await client.get(f"{url}/readyz")).json()["queued_jobs"]:
        await asyncio.sleep(poll_s)
    waited = time.monotonic() - began
    await asyncio.gather(*running)
    return refused.status_code, refused.headers.get("retry-after"), waited


async def run(url: str, poll_s: float) -> None:
    async with httpx.AsyncClient(timeout=300) as client:
        print(f"{'request':<16} {'status':>6} {'Retry-After s':>13} {'queue moved after s':>19}")
        for cells, steps in SHAPES:
            status, retry, waited = await one_shape(client, url, cells, steps, poll_s)
            shape = f"{cells} x {steps} steps"
            print(f"{shape:<16} {status:>6} {retry or '-':>13} {waited:>19.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--poll-s", type=float, default=0.25, help="how often /readyz is asked")
    args = parser.parse_args()
    proc = start_server(args.model, args.port)
    try:
        asyncio.run(run(f"http://127.0.0.1:{args.port}", args.poll_s))
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
