"""Sampling throughput and memory, fp32 and bf16 side by side in one process.

For each case (model shape, genes, batch size, steps) one randomly initialised st3 transformer is
built in fp32 and sampled with the same seeds under each precision, alternating runs so that
drift in machine load hits both equally. Reported per precision: cells/s, tokens/s (cells x genes
per second), ms per forward, peak memory, and the bf16 / fp32 ratios. Score parity (max and mean
|log p(bf16) - log p(fp32)| over the clean tokens, docs/precision.md "Parity") is measured on fixed
inputs.

Peak memory: see ``sedd.engine.monitor.PeakMemory`` (CUDA max allocated, or CPU peak RSS increase).
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from sedd.defaults import SamplingOptions
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, EngineJob, JobResult, ModelLimits
from sedd.engine.monitor import PeakMemory
from sedd.engine.offline import run_job
from sedd.models.st3 import SEDDTransformer
from sedd.precision import PrecisionPolicy, resolve_precision


@dataclass(frozen=True)
class BenchCase:
    hidden: int
    layers: int
    heads: int
    genes: int
    batch: int
    steps: int

    @property
    def label(self) -> str:
        return f"{self.hidden}/{self.layers}/{self.heads} G={self.genes} B={self.batch}"


@dataclass
class RunFigures:
    precision: str
    seconds: list[float] = field(default_factory=list)
    forwards: int = 0
    forwards_per_cell: float = 0.0  # what a cell cost (vLLM's "denoising steps per canvas")
    genes_per_forward: float = 0.0  # genes a cell commits a forward ("committed per step")
    peak_mib: float = 0.0
    record: dict[str, object] = field(default_factory=dict)

    def summary(self, case: BenchCase) -> dict[str, object]:
        seconds = statistics.median(self.seconds)
        cells_per_s = case.batch / seconds
        return {
            "precision": self.precision,
            "seconds_median": seconds,
            "seconds_all": self.seconds,
            "cells_per_s": cells_per_s,
            "tokens_per_s": cells_per_s * case.genes,
            "ms_per_forward": 1000 * seconds / self.forwards,
            "forwards": self.forwards,
            "forwards_per_cell": self.forwards_per_cell,
            "genes_per_forward": self.genes_per_forward,
            "peak_mib": self.peak_mib,
            "precision_record": self.record,
        }


class _ForwardCounter:
    """Engine observer counting the model forwards the engine actually ran."""

    def __init__(self) -> None:
        self.forwards = 0

    def on_forward(self, rows: int, seconds: float, calls: int = 1) -> None:
        self.forwards += calls

    def on_job_done(self, job: EngineJob, result: JobResult | None, outcome: str) -> None:
        return None


def _timed_sample(
    sampler: Sampler, case: BenchCase, seed: int
) -> tuple[float, int, float, JobResult]:
    """One batch of ``case.batch`` cells through the engine: (seconds, forwards, peak MiB,
    the job's result: what a cell cost)."""
    counter = _ForwardCounter()
    limits = ModelLimits.of_module(sampler.model, case.genes)
    engine = Engine(sampler, limits, max_rows_per_forward=case.batch, observer=counter)
    with PeakMemory(sampler.device) as peak:
        start = time.perf_counter()
        result = run_job(engine, EngineJob(case.batch, SamplingOptions(case.steps, seed=seed)))
        if sampler.device.type == "cuda":
            torch.cuda.synchronize(sampler.device)
        seconds = time.perf_counter() - start
    return seconds, counter.forwards, peak.mib, result


def score_parity(
    model: SEDDTransformer,
    policy: PrecisionPolicy,
    baseline: PrecisionPolicy,
    case: BenchCase,
    seed: int,
) -> dict[str, float]:
    """max / mean |log p0(bf16) - log p0(fp32)| over clean tokens at masked positions."""
    gen = torch.Generator().manual_seed(seed)
    device = baseline.device
    rows = min(case.batch, 8)
    x = torch.randint(0, model.mask_index, (rows, case.genes), generator=gen).to(device)
    masked = torch.rand(rows, case.genes, generator=gen).to(device) < 0.5
    x = torch.where(masked, model.mask_index, x)
    sigma = (torch.rand(rows, generator=gen) * 6.9).to(device)
    out = {}
    for name, pol in (("test", policy), ("fp32", baseline)):
        logits = pol.forward(model, x, sigma, positions=masked).scores  # (M, V) fp32
        out[name] = torch.log_softmax(logits[:, : model.mask_index], dim=-1)
    diff = (out["test"] - out["fp32"]).abs()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}


def run_case(
    case: BenchCase,
    device: torch.device,
    precisions: list[str],
    num_bins: int,
    repeats: int,
    seed: int = 0,
) -> dict[str, object]:
    torch.manual_seed(seed)
    model = SEDDTransformer(case.genes, num_bins, case.hidden, case.layers, case.heads)
    model = model.eval().to(device)
    noise, graph = LogLinearNoise(), AbsorbingGraph(num_bins)
    policies = {name: resolve_precision(name, device) for name in precisions}
    samplers = {name: Sampler(model, noise, graph, precision=pol) for name, pol in policies.items()}
    figures = {name: RunFigures(name) for name in precisions}
    warm = BenchCase(case.hidden, case.layers, case.heads, case.genes, min(case.batch, 2), 2)
    for sampler in samplers.values():
        _timed_sample(sampler, warm, seed)
    for _ in range(repeats):
        for name, sampler in samplers.items():  # alternate precisions within each repeat
            seconds, forwards, peak, result = _timed_sample(sampler, case, seed)
            fig = figures[name]
            fig.seconds.append(seconds)
            fig.forwards = forwards
            fig.forwards_per_cell = result.forwards_per_cell
            fig.genes_per_forward = result.genes_per_forward
            fig.peak_mib = max(fig.peak_mib, peak)
    results = {}
    for name, fig in figures.items():
        fig.record = policies[name].record()
        results[name] = fig.summary(case)
    entry: dict[str, object] = {"case": asdict(case), "results": results}
    if "fp32" in results:
        base = results["fp32"]
        entry["ratios_vs_fp32"] = {
            name: {
                "speedup_cells_per_s": r["cells_per_s"] / base["cells_per_s"],  # type: ignore[operator]
                "peak_memory": (
                    r["peak_mib"] / base["peak_mib"]  # type: ignore[operator]
                    if base["peak_mib"]
                    else float("nan")
                ),
            }
            for name, r in results.items()
            if name != "fp32"
        }
        entry["score_parity_vs_fp32"] = {
            name: score_parity(model, policies[name], policies["fp32"], case, seed)
            for name in precisions
            if name != "fp32"
        }
    return entry


def environment() -> dict[str, object]:
    info: dict[str, object] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name()
    return info
