"""The service held under long load, over real HTTP: three checks against ``sedd serve`` (real
uvicorn, the bundled model, fp32 on the CPU, one torch thread), each a pass or a fail with its
figures. They restate the soak figures of the hardening rounds (docs/service.md, "Under attack").

1. ``soak``: ``--clients`` clients send /generate requests of 1-4 cells x 2-6 steps back to
   back for ``--seconds``; every fifth is an SSE stream. Passes when every answer is a 200, 429
   or 422, no request fails at the connection, the engine is idle afterwards (no job, no row
   left) and the server's resident memory grew by less than 25% from the first quarter of the
   run to its end (a leak grows with the requests served).
2. ``cancel-storm``: ``--cancels`` streams are opened by 16 clients and dropped after 0-0.5 s,
   each after a random part of its events. Passes when the engine is idle afterwards, /metrics
   counts every dropped job that had reached the engine as cancelled, and a request sent then
   gets the cells of the same request run alone.
3. ``sse``: ``--streams`` SSE streams of 1 cell x 3 steps are opened at once. Passes when every
   stream that is admitted ends in ``result`` after ``queued`` and its ``progress`` events, every
   other one is a JSON 429, and every result's cells equal the same request run alone.

    .venv/bin/python scripts/soak_check.py                              # all three, short
    .venv/bin/python scripts/soak_check.py --only soak --seconds 300 --clients 40

Exits 1 if any check fails. Timings depend on the machine; the pass conditions do not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from serve_process import ServeProcess

BASE = ["--precision", "fp32", "--device", "cpu"]
CELLS_OF = re.compile(r"^sedd_jobs_total\{model=\"[^\"]*\",outcome=\"(\w+)\"\} ([0-9.e+]+)$", re.M)


def _rss_bytes(pid: int) -> int:
    """The server's resident memory now (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _jobs(url: str) -> dict[str, float]:
    """``sedd_jobs_total`` by outcome, from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {outcome: float(n) for outcome, n in CELLS_OF.findall(text)}


def _idle(url: str, timeout_s: float = 30.0) -> bool:
    """Whether the engine has no job and no row left within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pattern = re.compile(r'^sedd_engine\{model="[^"]*",quantity="(\w+)"\} ([0-9.e+]+)$', re.M)
    while time.monotonic() < deadline:
        gauges = dict(pattern.findall(httpx.get(f"{url}/metrics", timeout=10).text))
        if all(float(gauges.get(k, 1)) == 0 for k in ("queued_jobs", "active_jobs", "active_rows")):
            return True
        time.sleep(0.5)
    return False


async def _stream(client: httpx.AsyncClient, body: dict) -> tuple[int, list[str], dict | None]:
    """(status, event names, the result's data) of one SSE stream read to its end."""
    events: list[str] = []
    result = None
    async with client.stream("POST", "/generate/stream", json=body, timeout=300) as reply:
        if reply.status_code != 200:
            await reply.aread()
            return reply.status_code, events, None
        name = None
        async for line in reply.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
                events.append(name)
            elif line.startswith("data: ") and name == "result":
                result = json.loads(line[6:])
    return 200, events, result


def _cells_differ(answers: list[tuple[dict, list]]) -> int:
    """How many (body, counts) differ from ``Model.generate`` of the same request."""
    import torch

    import sedd

    torch.set_num_threads(1)
    model = sedd.load(device="cpu", precision="fp32")
    wrong = 0
    for body, counts in answers:
        alone = model.generate(body["num_cells"], condition=model.default_condition,
                               steps=body["steps"], seed=body["seed"], progress=False)  # fmt: skip
        wrong += not np.array_equal(np.array(counts), alone.X.toarray())
    return wrong


async def soak(server: ServeProcess, seconds: float, clients: int, seed: int) -> tuple[bool, str]:
    """Check 1 (see the module docstring)."""
    rng = random.Random(seed)
    statuses: Counter[int | str] = Counter()
    latencies: list[float] = []
    start = time.monotonic()
    stop = start + seconds
    rss: list[tuple[float, int]] = []

    async def sample_memory() -> None:
        while time.monotonic() < stop:
            rss.append((time.monotonic() - start, _rss_bytes(server.process.pid)))
            await asyncio.sleep(2)

    async def client(c: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            body = {"num_cells": rng.randint(1, 4), "steps": rng.randint(2, 6),
                    "seed": rng.randrange(10**6), "timeout_s": 60}  # fmt: skip
            began, retry_after = time.monotonic(), 1.0  # a refused stream's wait: 1 s
            try:
                if rng.random() < 0.2:
                    status, events, _ = await _stream(c, body)
                    ok = status != 200 or events[-1:] == ["result"]
                    statuses[status if ok else "stream without result"] += 1
                else:
                    reply = await c.post("/generate", json=body, timeout=120)
                    status = reply.status_code
                    statuses[status] += 1
                    retry_after = float(reply.headers.get("retry-after", 1))
            except httpx.HTTPError as err:
                statuses[type(err).__name__] += 1
                continue
            if status == 200:
                latencies.append(time.monotonic() - began)
            elif status == 429:
                await asyncio.sleep(min(retry_after, 5))

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=server.url, limits=limits) as c:
        await asyncio.gather(sample_memory(), *(client(c) for _ in range(clients)))
    idle = _idle(server.url)
    first = max(b for t, b in rss if t <= seconds / 4) if rss else 0
    last = rss[-1][1] if rss else 0
    growth = last / first - 1 if first else 0.0
    p50, p99 = np.percentile(latencies, [50, 99]) if latencies else (0.0, 0.0)
    passed = set(statuses) <= {200, 429, 422} and idle and growth < 0.25
    figures = (
        f"{clients} clients x {seconds:g} s: {sum(statuses.values())} requests "
        f"{dict(sorted(statuses.items(), key=str))}; 200s p50 {p50:.2f} s, p99 {p99:.2f} s; "
        f"idle after: {idle}; RSS {first / 2**20:.0f} -> {last / 2**20:.0f} MiB "
        f"({growth:+.1%})"
    )
    return passed, figures


async def cancel_storm(url: str, cancels: int, seed: int) -> tuple[bool, str]:
    """Check 2 (see the module docstring)."""
    rng = random.Random(seed)
    before = _jobs(url)
    dropped = Counter[str]()
    left = cancels

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            body = {"num_cells": rng.randint(1, 3), "steps": rng.randint(4, 12),
                    "seed": rng.randrange(10**6)}  # fmt: skip
            after = rng.uniform(0.0, 0.5)
            try:
                async with c.stream("POST", "/generate/stream", json=body, timeout=60) as reply:
                    if reply.status_code != 200:
                        dropped[f"refused {reply.status_code}"] += 1
                        continue
                    try:
                        async with asyncio.timeout(after):
                            async for _ in reply.aiter_lines():
                                pass
                        dropped["finished before the drop"] += 1
                    except TimeoutError:
                        dropped["dropped"] += 1
            except httpx.HTTPError as err:
                dropped[type(err).__name__] += 1

    async with httpx.AsyncClient(base_url=url) as c:
        await asyncio.gather(*(client(c) for _ in range(16)))
    idle = _idle(url)
    after = _jobs(url)
    cancelled = after.get("cancelled", 0) - before.get("cancelled", 0)
    body = {"num_cells": 2, "steps": 5, "seed": 7}
    reply = httpx.post(f"{url}/generate", json=body, timeout=120)
    wrong = _cells_differ([(body, reply.json()["counts"])]) if reply.status_code == 200 else 1
    # a stream dropped before its job reached the engine has nothing to cancel
    passed = idle and wrong == 0 and 0 < cancelled <= dropped["dropped"]
    figures = (
        f"{cancels} streams {dict(dropped)}; jobs cancelled by the engine: {cancelled:.0f}; "
        f"idle after: {idle}; the next request's cells equal its solo run: {wrong == 0}"
    )
    return passed, figures


async def sse(url: str, streams: int, seed: int) -> tuple[bool, str]:
    """Check 3 (see the module docstring)."""
    bodies = [{"num_cells": 1, "steps": 3, "seed": seed + i} for i in range(streams)]
    limits = httpx.Limits(max_connections=streams + 4)
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=url, limits=limits) as c:
        answers = await asyncio.gather(*(_stream(c, b) for b in bodies), return_exceptions=True)
    seconds = time.monotonic() - began
    statuses: Counter[int | str] = Counter()
    results, malformed = [], 0
    for body, answer in zip(bodies, answers, strict=True):
        if isinstance(answer, BaseException):
            statuses[type(answer).__name__] += 1
            continue
        status, events, result = answer
        statuses[status] += 1
        if status == 200:
            good = events[:1] == ["queued"] and events[-1:] == ["result"] and "progress" in events
            malformed += not good
            if result is not None:
                results.append((body, result["counts"]))
    wrong = _cells_differ(results)
    passed = set(statuses) <= {200, 429} and malformed == 0 and wrong == 0
    figures = (
        f"{streams} streams at once: {dict(sorted(statuses.items(), key=str))} in "
        f"{seconds:.1f} s; malformed event sequences: {malformed}; results whose cells differ "
        f"from a solo run: {wrong}"
    )
    return passed, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="soak duration")
    parser.add_argument("--clients", type=int, default=12, help="soak clients")
    parser.add_argument("--cancels", type=int, default=300, help="cancel-storm streams")
    parser.add_argument("--streams", type=int, default=300, help="SSE streams at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["soak", "cancel-storm", "sse"])
    args = parser.parse_args()
    results: list[tuple[str, bool, str]] = []
    if args.only in (None, "soak"):
        with ServeProcess(BASE) as server:
            results.append(("soak", *asyncio.run(
                soak(server, args.seconds, args.clients, args.seed))))  # fmt: skip
    if args.only in (None, "cancel-storm"):
        with ServeProcess(BASE) as server:
            results.append(("cancel-storm", *asyncio.run(
                cancel_storm(server.url, args.cancels, args.seed))))  # fmt: skip
    if args.only in (None, "sse"):
        with ServeProcess([*BASE, "--max-queued-jobs", str(args.streams)]) as server:
            results.append(("sse", *asyncio.run(sse(server.url, args.streams, args.seed))))
    for name, passed, figures in results:
        print(f"{'PASS' if passed else 'FAIL'}  {name:13s} {figures}")
    return 0 if all(passed for _, passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
