"""What an admission check costs the event loop (issue 44, item 9), and how /healthz answers
under load.

1. One refused admission check (``Workload.wait_before_fit``, the ``Retry-After`` search) at
   150 jobs in flight + 64 queued and at 256 + 64, with the server's limits (256 rows a
   forward, 1,024 in flight, blocks of 64): the replay it replaced (the reference in
   ``tests/engine/test_admission_cost.py``, every job played twice for each try) against the
   code now, in alternating rounds, medians and their ratio.
2. ``sedd serve`` (the bundled model, fp32 on the CPU, one torch thread) probed at
   ``/healthz`` every 50 ms while ``--small`` small /generate requests arrive at once (most
   are refused with a 429: each refusal is an admission check), then while 2 clients send
   ~3 MB /impute bodies back to back: median, p99 and max probe latency.

    .venv/bin/python scripts/bench_admission.py
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch
from serve_process import ServeProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
from test_admission_cost import _busy, _wait_before_fit  # the reference replay


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def admission(rounds: int) -> None:
    for running, waiting in ((150, 64), (256, 64)):
        load, new = _busy(running, waiting)
        arms = {
            "replay": lambda load=load, new=new: _wait_before_fit(load, new),
            "now": lambda load=load, new=new: load.wait_before_fit(new),
        }
        seconds: dict[str, list[float]] = {arm: [] for arm in arms}
        waits = set()
        for i in range(rounds):
            for arm in list(arms)[:: 1 if i % 2 == 0 else -1]:  # alternate which goes first
                start = time.perf_counter()
                waits.add(arms[arm]())
                seconds[arm].append(time.perf_counter() - start)
        old, now = (1000 * statistics.median(seconds[arm]) for arm in arms)
        print(f"admission check, {running} in flight + {waiting} queued (Retry-After "
              f"{sorted(waits)} s, both arms): replay {old:.1f} ms, now {now:.1f} ms, "
              f"{old / now:.1f}x (median of {rounds})")  # fmt: skip


async def probe(url: str, until: asyncio.Event) -> list[float]:
    seen = []
    async with httpx.AsyncClient(timeout=30) as client:
        while not until.is_set():
            start = time.perf_counter()
            await client.get(f"{url}/healthz")
            seen.append(time.perf_counter() - start)
            await asyncio.sleep(0.05)
    return seen


def report(what: str, seen: list[float]) -> None:
    ms = sorted(1000 * s for s in seen)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(f"/healthz while {what}: median {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, "
          f"max {ms[-1]:.1f} ms over {len(ms)} probes")  # fmt: skip


async def small_requests(url: str, n: int) -> None:
    done = asyncio.Event()
    probes = asyncio.ensure_future(probe(url, done))
    await asyncio.sleep(1.0)
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        body = {"num_cells": 2, "steps": 20}
        answers = await asyncio.gather(*(client.post(f"{url}/generate", json={**body, "seed": i})
                                         for i in range(n)))  # fmt: skip
    done.set()
    codes = statistics.multimode([a.status_code for a in answers])
    report(f"{n} small /generate requests arrive (most common status {codes})", await probes)


async def large_bodies(url: str, seconds: float) -> None:
    genes = [f"G{i}" for i in range(2000)]
    body = {"genes": genes, "counts": [[i % 7 for i in range(2000)] for _ in range(400)]}
    payload = httpx.Request("POST", "/", json=body).content
    done = asyncio.Event()
    probes = asyncio.ensure_future(probe(url, done))

    async def client_loop() -> int:
        sent = 0
        async with httpx.AsyncClient(timeout=600) as client:
            while not done.is_set():
                await client.post(f"{url}/impute", content=payload,
                                  headers={"content-type": "application/json"})  # fmt: skip
                sent += 1
        return sent

    clients = [asyncio.ensure_future(client_loop()) for _ in range(2)]
    await asyncio.sleep(seconds)
    done.set()
    sent = sum(await asyncio.gather(*clients))
    report(f"2 clients send {len(payload) / 2**20:.1f} MB bodies ({sent} sent)", await probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=330)
    parser.add_argument("--body-seconds", type=float, default=20.0)
    parser.add_argument("--no-server", action="store_true", help="only the admission checks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}, {torch.get_num_threads()} torch thread, Python "
          f"{platform.python_version()}")  # fmt: skip
    admission(args.rounds)
    if args.no_server:
        return
    with ServeProcess(["--precision", "fp32", "--device", "cpu"]) as server:
        asyncio.run(small_requests(server.url, args.small))
        asyncio.run(large_bodies(server.url, args.body_seconds))


if __name__ == "__main__":
    main()
