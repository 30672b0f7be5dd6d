"""Real uvicorn (``sedd serve``): cost admission counts the work already admitted. Requests that
could each finish alone, but not behind the ones admitted before them, get an immediate 429
with a Retry-After; none is admitted only to end in a 504, and a 1-cell request sent behind
them is answered within its own deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from server_client import FORWARD_COST_S, serve_subprocess

from server.intake import COST_MARGIN

# a real `sedd serve` (uvicorn) in a subprocess: CI's slow step, not the README's command
pytestmark = pytest.mark.slow

DEADLINE_S = 30.0


FLAGS = ["--precision", "fp32", "--device", "cpu", "--max-rows-per-forward", "4",
         "--max-rows-in-flight", "4", "--max-steps", "1000", "--log-level", "warning"]  # fmt: skip


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """``sedd serve`` on the bundled model: 4 rows a step and 4 rows in flight, each forward
    (one row: the CPU's block) priced at ``FORWARD_COST_S``."""
    with serve_subprocess(*FLAGS) as base:
        yield base


def _steps_for(seconds: float) -> int:
    """Steps of a 4-cell request that the server prices at about ``seconds`` alone: 4 forwards
    a step (and one more for the final denoise), each at ``FORWARD_COST_S`` x ``COST_MARGIN``.
    The price is fixed, so what is admitted does not depend on this machine's speed; the
    requests admitted then run faster than priced (about 0.04 s a forward here)."""
    return int(seconds / (4 * FORWARD_COST_S * COST_MARGIN)) - 1


def test_requests_that_fit_alone_but_not_behind_admitted_work_get_429_at_once(url: str) -> None:
    # 0.7 of the deadline alone, 1.4 behind the first
    steps = _steps_for(0.7 * DEADLINE_S)
    big = {"num_cells": 4, "steps": steps, "timeout_s": DEADLINE_S}

    async def load() -> tuple[list[tuple[httpx.Response, float]], httpx.Response, float]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def timed(body: dict) -> tuple[httpx.Response, float]:
                start = time.monotonic()
                response = await client.post("/generate", json=body)
                return response, time.monotonic() - start

            first = asyncio.ensure_future(timed({**big, "seed": 0}))
            await asyncio.sleep(0.5)  # admitted and running: it holds all 4 rows in flight
            others = [asyncio.ensure_future(timed({**big, "seed": i})) for i in (1, 2, 3)]
            await asyncio.sleep(0.5)
            start = time.monotonic()
            small = await client.post("/generate", json={"num_cells": 1, "steps": 10,
                                                         "timeout_s": DEADLINE_S})  # fmt: skip
            took = time.monotonic() - start
            return [await first, *await asyncio.gather(*others)], small, took

    bigs, small, took = asyncio.run(load())
    (first, _), rest = bigs[0], bigs[1:]
    assert first.status_code == 200, first.text
    for response, seconds in rest:  # each fits alone (0.7 of its deadline), not behind the first
        assert response.status_code == 429, response.text
        assert seconds < 2.0, seconds  # refused at once, not held to a 504
        assert int(response.headers["retry-after"]) >= 1
        detail = response.json()["detail"]
        assert detail.startswith("the requests already admitted would keep this one past")
    # it waits for the first one's rows, then runs its 11 ticks: inside its own deadline
    assert small.status_code == 200, small.text
    assert took < DEADLINE_S
