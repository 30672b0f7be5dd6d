"""Load benchmark: continuous batching vs one request at a time, over real HTTP, side by side.

Starts the service in-process under uvicorn (a background thread) twice on the same model:

* ``batched``: the engine packs every in-flight request's rows into one forward per step
  (``max_rows_per_forward`` = clients x cells per request);
* ``one-at-a-time``: ``max_rows_per_forward`` = one request's cells, so the engine steps one
  request at a time (the others queue).

N concurrent clients each send the same small request (``--cells`` x ``--steps``) repeatedly for
``--requests`` requests in all; the script prints throughput (cells/s) and latency p50/p90/p99
for both, and the ratio.

    .venv/bin/python scripts/bench_server.py --clients 16 --requests 64 --cells 1 --steps 10
    .venv/bin/python scripts/bench_server.py ... --random-model 64   # a random 64-gene model

``--replicas 1 2`` compares replica counts instead (``pip install -e '.[ray]'``): for each count,
``sedd serve --replicas N`` runs as its own process (a local Ray, one torch thread per replica,
one CPU reserved each), takes the same load, and is stopped; every response's cells are then
compared with ``Model.generate`` for the same request (same precision, one thread).

On a CPU the bundled model's cost per row is flat in the batch size (each cell is already 765
tokens through every matmul), so batching gains little there; it gains where one request leaves
the device idle: small models, few genes, and GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
import uvicorn
from serve_process import ServeProcess, free_port

from sedd.checkpoints import LoadedModel, build_model, save_native
from sedd.checkpoints.schema import ModelConfig
from sedd.defaults import DEFAULT_MODEL
from sedd.diffusion.graph import graph_from_config
from sedd.diffusion.noise import noise_from_config
from server.app import create_app
from server.config import Settings


@dataclass
class RunResult:
    mode: str
    cells: int
    seconds: float
    latencies: list[float]
    failures: int

    @property
    def cells_per_s(self) -> float:
        return self.cells / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")


class BackgroundServer:
    """uvicorn in a thread, so the clients talk to it over a real socket."""

    def __init__(self, settings: Settings) -> None:
        config = uvicorn.Config(
            create_app(settings), host=settings.host, port=settings.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{settings.host}:{settings.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not become ready within 120 s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


async def _load(
    url: str, args: argparse.Namespace, mode: str, answers: dict[int, list] | None = None
) -> RunResult:
    """``args.requests`` requests (seed i for request i) from ``args.clients`` clients;
    ``answers`` (when given) collects each answered request's counts by seed."""
    body = {"num_cells": args.cells, "steps": args.steps, "condition": args.condition}
    todo = list(range(args.requests))
    latencies: list[float] = []
    failures = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal failures
        while todo:
            i = todo.pop()
            start = time.perf_counter()
            response = await http.post(f"{url}/generate", json={**body, "seed": i})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - start)
                if answers is not None:
                    answers[i] = response.json()["counts"]
            else:
                failures += 1

    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await http.post(f"{url}/generate", json={**body, "steps": 2})  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(args.clients)))
        seconds = time.perf_counter() - start
    return RunResult(mode, len(latencies) * args.cells, seconds, latencies, failures)


def run_mode(args: argparse.Namespace, mode: str, rows: int) -> RunResult:
    settings = Settings(
        model=args.model,
        device=args.device,
        precision=args.precision,
        port=free_port(),
        max_rows_per_forward=rows,
        max_queued_jobs=max(64, args.clients * 2),
        max_cells_per_request=max(args.cells, 1),
        max_steps=max(args.steps, 2),
        log_level="warning",
    )
    with BackgroundServer(settings) as server:
        return asyncio.run(_load(server.url, args, mode))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=48, help="requests in all, per mode")
    parser.add_argument("--cells", type=int, default=2, help="cells per request")
    parser.add_argument("--steps", type=int, default=10, help="steps per request")
    parser.add_argument("--condition", default=None, help="condition (default: the control)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        metavar="N",
        help="compare these replica counts of `sedd serve --replicas N` (Ray) instead",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="with --replicas: also time the same requests in as many plain processes (no Ray, "
        "no HTTP), each with one torch thread: the most the cores give",
    )
    parser.add_argument(
        "--random-model",
        type=int,
        metavar="GENES",
        help="serve a random-weight model of the bundled model's shape (hidden 128, 4 layers, "
        "4 heads, 260 count bins, 10 labels) with GENES genes instead of --model",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.random_model is not None:
            args.model = save_random_model(Path(scratch) / "model", args.random_model)
        if args.replicas:
            bench_replicas(args)
        else:
            bench(args)


def save_random_model(dst: Path, num_genes: int) -> Path:
    """A random-weight conditional st3 model (throughput does not depend on the weights)."""
    labels = [f"label{i}" for i in range(10)]
    config = ModelConfig.model_validate(
        {
            "architecture": "st3_perturbation",
            "arch": {
                "num_genes": num_genes,
                "num_bins": 260,
                "num_perturbations": len(labels),
                "hidden_dim": 128,
                "num_layers": 4,
                "num_heads": 4,
            },
            "genes": [f"GENE{i}" for i in range(num_genes)],
            "perturbations": labels,
            "control_label": labels[0],
        }
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    noise = noise_from_config(config.noise.model_dump())
    graph = graph_from_config(config.graph.model_dump())
    save_native(LoadedModel(model, config, noise, graph, path=dst, file_hash=""), dst)
    return dst


def bench(args: argparse.Namespace) -> None:

    results = [
        run_mode(args, "batched", rows=args.clients * args.cells),
        run_mode(args, "one-at-a-time", rows=args.cells),
    ]
    print(
        f"{args.clients} clients, {args.requests} requests of {args.cells} cells x "
        f"{args.steps} steps, model {args.model}"
    )
    print(f"{'mode':<14} {'cells/s':>8} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'failed':>6}")
    for r in results:
        print(
            f"{r.mode:<14} {r.cells_per_s:8.2f} {r.percentile(50):7.2f} {r.percentile(90):7.2f} "
            f"{r.percentile(99):7.2f} {r.failures:6d}"
        )
    batched, serial = results
    ratio = batched.cells_per_s / serial.cells_per_s
    p50_ratio = serial.percentile(50) / batched.percentile(50)
    print(f"batching / one-at-a-time: throughput x{ratio:.2f}, p50 latency x{p50_ratio:.2f} lower")
    if args.json is not None:
        figures = {
            r.mode: {
                "cells_per_s": r.cells_per_s,
                "p50_s": r.percentile(50),
                "p90_s": r.percentile(90),
                "p99_s": r.percentile(99),
                "mean_s": statistics.fmean(r.latencies) if r.latencies else None,
                "failures": r.failures,
            }
            for r in results
        }
        figures["throughput_ratio"] = ratio  # type: ignore[assignment]
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"model": str(args.model)}, **figures}, indent=2, default=str
            )
        )


def replica_server(args: argparse.Namespace, replicas: int) -> ServeProcess:
    """``sedd serve --replicas N`` (its own local Ray), ready once /metrics shows N replicas."""

    def all_replicas_seen(metrics: httpx.Response) -> bool:
        seen = {line.split('replica="')[1].split('"')[0] for line in metrics.text.splitlines()
                if 'replica="' in line}  # fmt: skip
        return metrics.status_code == 200 and len(seen) >= replicas

    flags = [
        "--replicas", str(replicas), "--threads-per-replica", "1", "--cpus-per-replica", "1",
        "--model", str(args.model), "--device", args.device, "--precision", args.precision,
        "--max-queued-jobs", str(max(64, args.clients * 2)),
        "--max-cells-per-request", str(max(args.cells, 1)), "--max-steps", str(max(args.steps, 2)),
    ]  # fmt: skip
    return ServeProcess(flags, ready_path="/metrics", ready=all_replicas_seen, timeout_s=300)


def _plain_worker(args: argparse.Namespace, seeds: list[int], start, out) -> None:
    """One process without a server: ``Model.generate`` of each seed's request, one by one."""
    import sedd

    torch.set_num_threads(1)
    model = sedd.load(args.model, device=args.device if args.device != "auto" else None,
                      precision=args.precision)  # fmt: skip
    condition = args.condition or model.default_condition
    model.generate(args.cells, condition=condition, steps=2, progress=False)  # warm-up
    start.wait()
    began = time.perf_counter()
    for seed in seeds:
        model.generate(args.cells, condition=condition, steps=args.steps, seed=seed,
                       progress=False)  # fmt: skip
    out.put((began, time.perf_counter()))


def bench_processes(args: argparse.Namespace, count: int) -> float:
    """Cells/s of ``count`` plain processes (no Ray, no HTTP) sharing ``args.requests``
    requests: what this machine's cores give the model alone, the ceiling for the replicas."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(count + 1), ctx.Queue()
    seeds = list(range(args.requests))
    workers = [ctx.Process(target=_plain_worker, args=(args, seeds[i::count], start, out))
               for i in range(count)]  # fmt: skip
    for worker in workers:
        worker.start()
    start.wait()  # every process has loaded its model and warmed up
    spans = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    seconds = max(end for _, end in spans) - min(began for began, _ in spans)
    return args.requests * args.cells / seconds


def bench_replicas(args: argparse.Namespace) -> None:
    """Throughput and latency of each replica count under the same load, and every response
    checked against ``Model.generate`` for the same request."""
    import sedd

    results, answers = [], {}
    for count in args.replicas:
        answers[count] = {}
        with replica_server(args, count) as server:
            result = asyncio.run(_load(server.url, args, f"{count} replica(s)", answers[count]))
        results.append(result)
    plain = {count: bench_processes(args, count) for count in args.replicas} if args.ceiling else {}
    torch.set_num_threads(1)  # as each replica runs
    model = sedd.load(args.model, device=args.device if args.device != "auto" else None,
                      precision=args.precision)  # fmt: skip
    condition = args.condition or model.default_condition
    mismatches = checked = 0
    for seed in sorted({seed for got in answers.values() for seed in got}):
        want = model.generate(args.cells, condition=condition, steps=args.steps, seed=seed,
                              progress=False).X.toarray()  # fmt: skip
        for got in answers.values():
            if seed in got:
                checked += 1
                mismatches += int(not np.array_equal(np.asarray(got[seed]), want))
    print(
        f"{args.clients} clients, {args.requests} requests of {args.cells} cells x "
        f"{args.steps} steps, model {args.model}, precision {args.precision}, 1 torch thread "
        "per replica"
    )
    print(f"{'replicas':<12} {'cells/s':>8} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'failed':>6}")
    for r in results:
        print(
            f"{r.mode:<12} {r.cells_per_s:8.2f} {r.percentile(50):7.2f} {r.percentile(90):7.2f} "
            f"{r.percentile(99):7.2f} {r.failures:6d}"
        )
    base = results[0]
    for r in results[1:]:
        print(f"{r.mode} / {base.mode}: throughput x{r.cells_per_s / base.cells_per_s:.2f}")
    if plain:
        first = args.replicas[0]
        for count, rate in plain.items():
            print(f"{count} plain process(es), no server: {rate:.2f} cells/s "
                  f"(x{rate / plain[first]:.2f} of {first})")  # fmt: skip
    print(
        f"responses equal to Model.generate for the same request: {checked - mismatches}/{checked}"
    )
    if args.json is not None:
        figures = {
            r.mode: {"cells_per_s": r.cells_per_s, "p50_s": r.percentile(50),
                     "p90_s": r.percentile(90), "p99_s": r.percentile(99),
                     "failures": r.failures}
            for r in results
        }  # fmt: skip
        figures["responses_checked"] = {"checked": checked, "mismatches": mismatches}
        figures["plain_processes_cells_per_s"] = {str(k): v for k, v in plain.items()}
        args.json.write_text(json.dumps({"args": vars(args) | {"model": str(args.model)},
                                         **figures}, indent=2, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
