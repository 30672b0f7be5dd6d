"""The service under abuse, over real HTTP: six checks against ``sedd serve`` (real uvicorn,
the bundled model, fp32 on the CPU), each a pass or a fail with its figures.

1. ``mixed``: 10 clients send requests of 1-6 cells x 3-8 steps with deadlines of 10-40 s, back
   to back, for ``--seconds`` against small limits (8 rows a step, 16 in flight, 2 queued).
   Passes when every answer is a 200, 429 or 422 (no 504: admission refuses at once what would
   not finish in time) and every 200's cells equal the same request run alone.
2. ``drip``: 512 connections each get an early answer (a 404 before their body) and then drip
   one body byte every 3 s, while a client asks for /healthz every half second. Passes when the
   client is never kept waiting longer than the header timeout (10 s).
3. ``behind-maximal``: at the default limits, four maximal requests are admitted (256 cells, each
   about 100 s alone), then a 1-cell request with a 40 s deadline is sent. Passes when its cells
   come back (200) within its deadline: it joins the reserve for small requests.

4. ``large-bodies``: six 3.2 MB /impute bodies (800,000 rows each, refused with a 422) are
   sent at once while a client asks for /healthz every 50 ms. Passes when the median wait is
   under 1 s (the bodies are parsed off the event loop; on it, the median was 2.04 s). Off it,
   on a 2-core machine, the loop still shares the GIL with the parser thread and receives the
   19 MB itself: medians of 0.13-0.72 s were measured, before and after the structure round
   (a 0.5 s limit failed a CI run at 0.72 s, and passed the previous release at 0.50 s).

5. ``retry-after``: the one check of the measured forward time (the test suite prices forwards
   at a fixed cost, ``SEDD_FORWARD_COST_S``, so it does not follow the machine's load). With 4
   rows a tick, 8 in flight and one queue place, an 8-cell request joins, a second queues and a
   third is refused: its Retry-After must be within 0.6x and 2.5x (+ 2 s) of the wait the
   queued one really had (it read a fraction of it when priced at the cheaper ticks before).

6. ``models``: ``sedd serve --models DIR`` with the bundled v2 and v1 models (small limits: 8
   rows a step, 16 in flight, 2 queued, per model). One client sends 1-cell x 3-step requests to
   v1, first alone for ``--seconds`` / 4 (the baseline), then beside a burst of 8 clients sending
   4-6 cells x 6-8 steps to v2 back to back. Passes when every v1 request is a 200 with the cells
   of v1 alone (none refused, none late: one engine thread gives each model a tick a round, so
   the burst's ticks slow v1's and never stop them) and v2's answers are 200, 429 or 422 with
   v2's cells. v1's latency beside the burst against its baseline is printed, not judged: it is
   about a v2 tick over a v1 tick, which depends on the machine.

    .venv/bin/python scripts/overload_check.py                 # all six, 120 s of mixed load
    .venv/bin/python scripts/overload_check.py --only drip

Exits 1 if any check fails. Timings depend on the machine; the pass conditions do not.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
from serve_process import ServeProcess

SMALL_LIMITS = ["--max-rows-per-forward", "8", "--max-rows-in-flight", "16",
                "--max-queued-jobs", "2"]  # fmt: skip
BASE = ["--precision", "fp32", "--device", "cpu"]
HEADER_TIMEOUT_S = 10.0
ROOT = Path(__file__).resolve().parents[1]
MODELS = {"v2": ROOT / "models" / "pbmc_default", "v1": ROOT / "models" / "pbmc_v1"}


async def mixed(url: str, seconds: float, clients: int, seed: int) -> tuple[bool, str]:
    """Check 1: the mixed load; every 200 compared with the same request alone."""
    rng = random.Random(seed)
    answers: list[tuple[dict, int, float, httpx.Response]] = []
    stop = time.monotonic() + seconds

    async def client(c: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            body = {
                "num_cells": rng.randint(1, 6),
                "steps": rng.randint(3, 8),
                "seed": rng.randrange(10**6),
                "timeout_s": rng.choice([10, 20, 40]),
            }
            start = time.monotonic()
            reply = await c.post("/generate", json=body, timeout=body["timeout_s"] + 10)
            answers.append((body, reply.status_code, time.monotonic() - start, reply))
            if reply.status_code == 429:
                await asyncio.sleep(min(float(reply.headers.get("retry-after", 1)), 5))

    async with httpx.AsyncClient(base_url=url) as c:
        await asyncio.gather(*(client(c) for _ in range(clients)))
    statuses = Counter(status for _, status, _, _ in answers)
    ok = [(body, reply) for body, status, _, reply in answers if status == 200]
    wrong = _cells_differ(ok)
    slowest = max((s for _, status, s, _ in answers if status == 200), default=0.0)
    passed = set(statuses) <= {200, 429, 422} and not wrong
    late = [f"{b['num_cells']}x{b['steps']} in {b['timeout_s']} s: {seconds:.1f} s"
            for b, status, seconds, _ in answers if status == 504]  # fmt: skip
    figures = (
        f"{len(answers)} requests: {dict(sorted(statuses.items()))}; slowest 200 "
        f"{slowest:.1f} s; 200s whose cells differ from a solo run: {len(wrong)}"
        + (f"; 504s: {', '.join(late)}" if late else "")
        + f"; {_latencies(answers)}"
    )
    return passed, figures


def _latencies(answers: list[tuple[dict, int, float, httpx.Response]]) -> str:
    """p50 / p99 seconds of the 200s, short requests (1 cell) apart from the longer ones: a
    short request must not wait for long ones to finish."""
    parts = []
    for name, keep in (("1 cell", lambda b: b["num_cells"] == 1),
                       ("2-6 cells", lambda b: b["num_cells"] > 1)):  # fmt: skip
        seconds = [s for b, status, s, _ in answers if status == 200 and keep(b)]
        if seconds:
            p50, p99 = np.percentile(seconds, [50, 99])
            parts.append(f"{name} p50 {p50:.2f} s, p99 {p99:.2f} s ({len(seconds)})")
    return "latency of 200s: " + "; ".join(parts)


def _cells_differ(ok: list[tuple[dict, httpx.Response]]) -> list[dict]:
    """The bodies of 200s whose cells differ from ``Model.generate`` of the same request."""
    import torch

    import sedd

    torch.set_num_threads(1)
    model = sedd.load(device="cpu", precision="fp32")
    wrong = []
    for body, reply in ok:
        alone = model.generate(body["num_cells"], condition=model.default_condition,
                               steps=body["steps"], seed=body["seed"], progress=False)  # fmt: skip
        if not np.array_equal(np.array(reply.json()["counts"]), alone.X.toarray()):
            wrong.append(body)
    return wrong


def _drip_connection(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setblocking(False)
    head = b"POST /no-such-route HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    sock.send(head)
    return sock


async def drip(url: str, connections: int, seconds: float) -> tuple[bool, str]:
    """Check 2: slow-drip connections after an early answer against a legitimate client."""
    parsed = urlparse(url)
    socks = [_drip_connection(parsed.hostname or "127.0.0.1", parsed.port or 80)
             for _ in range(connections)]  # fmt: skip
    waits: list[float] = []
    stop = time.monotonic() + seconds
    closed = 0
    async with httpx.AsyncClient(base_url=url, timeout=HEADER_TIMEOUT_S + 20) as c:
        next_drip = time.monotonic()
        while time.monotonic() < stop:
            if time.monotonic() >= next_drip:
                closed = sum(_drip_byte(s) for s in socks)
                next_drip += 3.0
            start = time.monotonic()
            reply = await c.get("/healthz")
            waits.append(time.monotonic() - start if reply.status_code == 200 else float("inf"))
            await asyncio.sleep(0.5)
    for s in socks:
        s.close()
    worst = max(waits)
    passed = worst <= HEADER_TIMEOUT_S
    return passed, (
        f"{connections} drip connections, {closed} closed by the server; /healthz "
        f"{len(waits)} times, slowest {worst:.2f} s (limit {HEADER_TIMEOUT_S:g} s)"
    )


def _drip_byte(sock: socket.socket) -> bool:
    """Send one more body byte; True once the server has closed the connection."""
    try:
        if sock.recv(65536) == b"":
            return True
    except BlockingIOError:
        pass
    except OSError:
        return True
    try:
        sock.send(b"x")
    except OSError:
        return True
    return False


async def behind_maximal(url: str) -> tuple[bool, str]:
    """Check 3: a 1-cell request behind four admitted maximal ones (256 cells, steps enough for
    about 100 s each alone, so that all four fit the default 600 s deadline together) is served
    within its deadline. It shares each step's forward with them, so its own 2 steps + denoise
    take three such steps: its deadline is four (at least 40 s)."""
    async with httpx.AsyncClient(base_url=url, timeout=700) as c:
        per_step = await _step_seconds(c, 256)
        steps = max(1, min(999, int(100.0 / per_step) - 1))
        deadline = max(40, math.ceil(4 * per_step))
        big = [asyncio.ensure_future(c.post("/generate", json={"num_cells": 256,
                                                                "steps": steps, "seed": s}))
               for s in range(4)]  # fmt: skip
        await asyncio.sleep(2.0)
        start = time.monotonic()
        body = {"num_cells": 1, "steps": 2, "timeout_s": deadline}
        small = await c.post("/generate", json=body, timeout=deadline + 20)
        took = time.monotonic() - start
        refused = [t.result().status_code for t in big if t.done()]
        for task in big:
            task.cancel()
    passed = took <= deadline and small.status_code == 200 and not refused
    retry = ""
    if small.status_code == 429:
        retry = f", Retry-After {small.headers.get('retry-after')} s"
    return passed, (
        f"4 x (256 cells x {steps} steps), answered at once: {refused or 'none (all admitted)'};"
        f" 1-cell x 2-step request: {small.status_code} after {took:.1f} s (deadline "
        f"{deadline} s; alone the big ones take {per_step * (steps + 1):.0f} s each){retry}"
    )


async def _step_seconds(c: httpx.AsyncClient, cells: int) -> float:
    """Seconds a step of a ``cells``-cell request takes alone, from the server's own estimate
    (its 422 for a request far too long names it)."""
    reply = await c.post("/generate", json={"num_cells": cells, "steps": 1000, "timeout_s": 1})
    [error] = reply.json()["detail"]
    return float(error["ctx"]["estimated_s"]) / 1001


async def large_bodies(url: str) -> tuple[bool, str]:
    """Check 4: /healthz while six large bodies are parsed."""
    body = b'{"genes": ["GENE0"], "counts": [' + b",".join([b"[1]"] * 800_000) + b"]}"
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        posts = [asyncio.ensure_future(c.post("/impute", content=body, headers=headers))
                 for _ in range(6)]  # fmt: skip
        waits: list[float] = []
        while not all(p.done() for p in posts):
            start = time.monotonic()
            await c.get("/healthz")
            waits.append(time.monotonic() - start)
            await asyncio.sleep(0.05)
        statuses = sorted({p.result().status_code for p in posts})
        sizes = max(len(p.result().content) for p in posts)
    median = sorted(waits)[len(waits) // 2]
    passed = median < 1.0 and statuses == [422]
    return passed, (
        f"6 x 3.2 MB bodies: {statuses}, largest answer {sizes} bytes; /healthz {len(waits)} "
        f"times, median {median:.2f} s, slowest {max(waits):.2f} s"
    )


async def retry_after(url: str) -> tuple[bool, str]:
    """Check 5: a full queue's Retry-After, priced at the measured forward time, against the
    wait it announces, right after a big request joined."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        cheap = await c.post("/generate", json={"num_cells": 1, "steps": 60, "seed": 0})
        body = {"num_cells": 8, "steps": 30}
        first = asyncio.ensure_future(c.post("/generate", json={**body, "seed": 1}))
        await asyncio.sleep(0.2)  # it has just joined: 8 rows, 4 stepped a tick
        second = asyncio.ensure_future(c.post("/generate", json={**body, "seed": 2}))
        await asyncio.sleep(0.1)  # the queue's one place
        refused = await c.post("/generate", json={**body, "seed": 3})
        began = time.monotonic()
        while (await c.get("/readyz")).json()["queued_jobs"]:
            await asyncio.sleep(0.1)
        waited = time.monotonic() - began
        answers = [cheap.status_code, *(r.status_code for r in await asyncio.gather(first, second))]
    said = int(refused.headers.get("retry-after", -1))
    passed = (refused.status_code == 429 and answers == [200, 200, 200]
              and 0.6 * waited <= said <= 2.5 * waited + 2)  # fmt: skip
    return passed, (
        f"third request {refused.status_code}, Retry-After {said} s; the queued one waited "
        f"{waited:.1f} s (pass: 0.6x to 2.5x + 2 s); others {answers}"
    )


async def models(url: str, seconds: float, seed: int) -> tuple[bool, str]:
    """Check 6: a burst on v2 beside a client of small v1 requests (see the docstring)."""
    rng = random.Random(seed)
    small: list[tuple[str, dict, int, float, httpx.Response]] = []
    burst: list[tuple[dict, int, httpx.Response]] = []

    async def ask_v1(c: httpx.AsyncClient, until: float, phase: str) -> None:
        while time.monotonic() < until:
            body = {"model": "v1", "num_cells": 1, "steps": 3, "seed": rng.randrange(10**6),
                    "timeout_s": 60}  # fmt: skip
            start = time.monotonic()
            reply = await c.post("/generate", json=body, timeout=90)
            small.append((phase, body, reply.status_code, time.monotonic() - start, reply))

    async def ask_v2(c: httpx.AsyncClient, until: float) -> None:
        while time.monotonic() < until:
            body = {"model": "v2", "num_cells": rng.randint(4, 6), "steps": rng.randint(6, 8),
                    "seed": rng.randrange(10**6), "timeout_s": 60}  # fmt: skip
            reply = await c.post("/generate", json=body, timeout=90)
            burst.append((body, reply.status_code, reply))
            if reply.status_code == 429:
                await asyncio.sleep(min(float(reply.headers.get("retry-after", 1)), 5))

    async with httpx.AsyncClient(base_url=url) as c:
        await ask_v1(c, time.monotonic() + seconds / 4, "alone")
        until = time.monotonic() + seconds
        await asyncio.gather(ask_v1(c, until, "burst"), *(ask_v2(c, until) for _ in range(8)))
    alone = [s for phase, _, status, s, _ in small if phase == "alone" and status == 200]
    beside = [s for phase, _, status, s, _ in small if phase == "burst" and status == 200]
    v1_statuses = Counter(status for _, _, status, _, _ in small)
    v2_statuses = Counter(status for _, status, _ in burst)
    wrong = _model_cells_differ(
        [(b, r) for _, b, status, _, r in small if status == 200]
        + [(b, r) for b, status, r in burst if status == 200][:20]
    )
    base_p50 = float(np.percentile(alone, 50)) if alone else math.inf
    p50, p99 = np.percentile(beside, [50, 99]) if beside else (math.inf, math.inf)
    passed = set(v1_statuses) == {200} and set(v2_statuses) <= {200, 429, 422} and not wrong
    return passed, (
        f"v1 1-cell requests: alone p50 {base_p50:.2f} s ({len(alone)}); beside the v2 burst "
        f"p50 {p50:.2f} s, p99 {p99:.2f} s ({len(beside)}), p99/alone-p50 "
        f"{p99 / base_p50:.1f}x; v1 statuses {dict(v1_statuses)}; v2 burst "
        f"{dict(sorted(v2_statuses.items()))}; 200s whose cells differ from their model alone: "
        f"{len(wrong)}"
    )


def _model_cells_differ(ok: list[tuple[dict, httpx.Response]]) -> list[dict]:
    """The bodies of 200s whose cells differ from their own model's ``Model.generate``."""
    import torch

    import sedd

    torch.set_num_threads(1)
    loaded = {name: sedd.load(path, device="cpu", precision="fp32")
              for name, path in MODELS.items()}  # fmt: skip
    wrong = []
    for body, reply in ok:
        model = loaded[body["model"]]
        alone = model.generate(body["num_cells"], condition=model.default_condition,
                               steps=body["steps"], seed=body["seed"], progress=False)  # fmt: skip
        if not np.array_equal(np.array(reply.json()["counts"]), alone.X.toarray()):
            wrong.append(body)
    return wrong


def _repository(root: Path) -> Path:
    """A model repository of links to the bundled v2 and v1 models."""
    for name, path in MODELS.items():
        (root / name).symlink_to(path.absolute(), target_is_directory=True)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="mixed load duration")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--connections", type=int, default=512, help="drip connections")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["mixed", "drip", "behind-maximal", "large-bodies",
                                           "retry-after", "models"])  # fmt: skip
    args = parser.parse_args()
    results: list[tuple[str, bool, str]] = []
    if args.only in (None, "mixed"):
        with ServeProcess([*BASE, *SMALL_LIMITS]) as server:
            results.append(("mixed", *asyncio.run(
                mixed(server.url, args.seconds, args.clients, args.seed))))  # fmt: skip
    if args.only in (None, "drip"):
        with ServeProcess(BASE) as server:
            results.append(("drip", *asyncio.run(drip(server.url, args.connections, 20.0))))
    if args.only in (None, "behind-maximal"):
        with ServeProcess(BASE) as server:
            results.append(("behind-maximal", *asyncio.run(behind_maximal(server.url))))
    if args.only in (None, "large-bodies"):
        with ServeProcess(BASE) as server:
            results.append(("large-bodies", *asyncio.run(large_bodies(server.url))))
    if args.only in (None, "retry-after"):
        queue = ["--max-rows-per-forward", "4", "--max-rows-in-flight", "8",
                 "--max-queued-jobs", "1"]  # fmt: skip
        with ServeProcess([*BASE, *queue]) as server:
            results.append(("retry-after", *asyncio.run(retry_after(server.url))))
    if args.only in (None, "models"):
        with tempfile.TemporaryDirectory() as tmp:
            flags = [*BASE, *SMALL_LIMITS, "--models", str(_repository(Path(tmp))),
                     "--default-model", "v2"]  # fmt: skip
            with ServeProcess(flags) as server:
                results.append(("models", *asyncio.run(
                    models(server.url, args.seconds, args.seed))))  # fmt: skip
    for name, passed, figures in results:
        print(f"{'PASS' if passed else 'FAIL'}  {name:15s} {figures}")
    return 0 if all(passed for _, passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
