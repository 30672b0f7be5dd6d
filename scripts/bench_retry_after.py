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
import time
from pathlib import Path

import httpx
from serve_process import ServeProcess

from sedd.defaults import DEFAULT_MODEL

SHAPES = ((4, 20), (2, 40), (4, 10), (3, 30))  # cells x steps of every request in one round


def serve(model: Path) -> ServeProcess:
    """The bundled (or given) model, fp32 on the CPU, two requests running and one waiting."""
    return ServeProcess([
        "--model", str(model), "--precision", "fp32", "--device", "cpu",
        "--max-rows-per-forward", "2", "--max-queued-jobs", "1", "--max-cells-per-request", "4",
        "--max-steps", "60",
    ])  # fmt: skip


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
    parser.add_argument("--poll-s", type=float, default=0.25, help="how often /readyz is asked")
    args = parser.parse_args()
    with serve(args.model) as server:
        asyncio.run(run(server.url, args.poll_s))


if __name__ == "__main__":
    main()
