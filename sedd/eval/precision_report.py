"""The autocast op-policy probe, applied to a loaded model: what runs in which dtype, what it costs.

For a model under a precision policy (``sedd.precision``) the report gives

1. **module dtypes**: forward hooks on every submodule record the dtypes of its parameters and
   outputs during one forward under the policy's autocast; ``blocks.0``, ``blocks.1``, ... fold
   into ``blocks.*`` so a 30-layer model reads like a 1-layer one;
2. **log-score error** of the policy (bf16 by default) against fp32 on real inputs: clean tokens
   from an h5ad (or random counts), noised by the model's own forward process at t ~ U(0, 1),
   scored at the positions the sampler reads (masked ones for absorbing graphs). The log-score is
   what the sampler uses: for x0 models log p0(y | x_t) - log(e^sigma - 1), whose sigma term is
   fp32 in both runs, so the error is that of log p0; for score models the network output;
3. **speed**: median seconds per forward for fp32 and the policy, alternated in one process,
   and the ratio (bf16 / fp32 speed = fp32 time / bf16 time; > 1 means bf16 is faster).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sedd.checkpoints import LoadedModel
from sedd.io.read import align_genes, read_counts
from sedd.io.tokens import counts_to_tokens
from sedd.precision import PrecisionPolicy, resolve_precision


@dataclass(frozen=True)
class ModuleDtype:
    """One row of the dtype table: a module (or folded family of modules) and its dtypes."""

    name: str
    kind: str  # class name
    param_dtypes: str  # e.g. "float32", "-" for no parameters of its own
    output_dtypes: str  # e.g. "bfloat16", "float32", "bfloat16,float32" when mixed
    calls: int


@dataclass
class ProbeBatch:
    """Noised inputs for the probe: x (B, L) tokens at total noise sigma (B,)."""

    x: torch.Tensor
    sigma: torch.Tensor
    labels: torch.Tensor | None
    cell_types: torch.Tensor | None
    source: str  # where the clean tokens came from


@dataclass
class PrecisionReport:
    policy: dict[str, object]
    inputs: dict[str, object]
    modules: list[ModuleDtype]
    score_error: dict[str, float]
    speed: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "modules": [asdict(row) for row in self.modules]}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensors(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def folded_names(model: nn.Module) -> dict[str, str]:
    """Module name -> name with ModuleList indices folded: ``blocks.3.attn`` -> ``blocks.*.attn``.

    Only indices into an ``nn.ModuleList`` fold; ``nn.Sequential`` indices (``ff.net.0`` Linear,
    ``ff.net.1`` GELU) stay, since their members differ.
    """
    folded = {"": "(model)"}
    for name, module in model.named_modules():
        for child, _ in module.named_children():
            full = f"{name}.{child}" if name else child
            prefix = folded[name] + "." if name else ""
            part = "*" if isinstance(module, nn.ModuleList) and child.isdigit() else child
            folded[full] = prefix + part
    return folded


def module_dtypes(
    model: nn.Module, policy: PrecisionPolicy, batch: ProbeBatch, *, fold: bool = True
) -> list[ModuleDtype]:
    """Dtypes of every submodule's parameters and outputs in one forward under ``policy``.

    The last row, ``(policy output)``, is what the sampler receives: fp32 by rule 3.
    """
    names = folded_names(model) if fold else {n: n or "(model)" for n, _ in model.named_modules()}
    seen: dict[str, dict[str, Any]] = {}
    handles = []

    def hook_for(name: str, module: nn.Module) -> Any:
        own = {_dtype_name(p.dtype) for p in module.parameters(recurse=False)}
        row = seen.setdefault(
            name, {"kind": type(module).__name__, "params": set(), "outputs": set(), "calls": 0}
        )
        row["params"] |= own

        def hook(_: nn.Module, __: object, output: object) -> None:
            row["calls"] += 1
            row["outputs"] |= {_dtype_name(t.dtype) for t in _tensors(output)}

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(hook_for(names[name], module)))
    try:
        out = policy.forward(
            model, batch.x, batch.sigma, labels=batch.labels, cell_types=batch.cell_types
        ).scores
    finally:
        for handle in handles:
            handle.remove()
    rows = [
        ModuleDtype(
            name=name,
            kind=row["kind"],
            param_dtypes=",".join(sorted(row["params"])) or "-",
            output_dtypes=",".join(sorted(row["outputs"])) or "-",
            calls=row["calls"],
        )
        for name, row in seen.items()
    ]
    rows.append(
        ModuleDtype("(policy output)", "PrecisionPolicy.forward", "-", _dtype_name(out.dtype), 1)
    )
    return rows


def _random_counts(cells: int, genes: int, num_bins: int, gen: torch.Generator) -> torch.Tensor:
    # Geometric(1/2) counts: mostly 0 and 1 with a tail, like sparse single-cell data.
    u = torch.rand(cells, genes, generator=gen, dtype=torch.float64)
    counts = torch.floor(torch.log1p(-u) / np.log(0.5)).long()
    return counts.clamp_(max=num_bins - 1)


def probe_batch(
    loaded: LoadedModel,
    *,
    cells: int = 8,
    data: str | Path | None = None,
    label_key: str | None = None,
    seed: int = 0,
) -> ProbeBatch:
    """``cells`` clean cells (from ``data`` or random counts) noised at t ~ U(0.05, 1)."""
    if cells < 1:
        raise ValueError(f"`cells` must be >= 1, got {cells}.")
    cfg = loaded.config
    gen = torch.Generator().manual_seed(seed)
    names: list[str] | None = None
    if data is not None:
        adata = align_genes(read_counts(data), cfg.genes)
        rows = torch.randperm(adata.n_obs, generator=gen)[:cells].numpy()
        tokens = counts_to_tokens(adata.X[rows], cfg.tokens.num_bins, genes=cfg.genes, clip=True)
        clean = tokens.tokens
        source = f"{data}: {len(rows)} of {adata.n_obs} cells"
        if label_key is not None:
            if label_key not in adata.obs:
                raise ValueError(
                    f"label_key {label_key!r} is not an obs column of {data}; "
                    f"columns: {list(adata.obs.columns)}."
                )
            names = [str(v) for v in adata.obs[label_key].iloc[rows]]
    else:
        clean = _random_counts(cells, cfg.num_genes, cfg.tokens.num_bins, gen)
        source = f"{cells} cells of random Geometric(1/2) counts"
    n = clean.shape[0]
    t = 0.05 + 0.95 * torch.rand(n, generator=gen, dtype=torch.float64)
    sigma = loaded.noise.total_noise(t).float()  # (B,)
    x = loaded.graph.sample_transition(clean, sigma[:, None], generator=gen)  # (B, L)
    labels = cell_types = None
    vectors = loaded.perturbation_vectors
    known = list(vectors) if vectors is not None else (loaded.conditions or None)
    if known is not None:
        if names is None:
            names = [known[i] for i in torch.randint(len(known), (n,), generator=gen).tolist()]
        labels = loaded.perturbation_labels(names).to(loaded.device)
    elif cfg.num_perturbations > 0:  # labels without names: indices
        labels = torch.randint(cfg.num_perturbations, (n,), generator=gen).to(loaded.device)
    if cfg.num_cell_types > 0:
        cell_types = torch.randint(cfg.num_cell_types, (n,), generator=gen).to(loaded.device)
    device = loaded.device
    return ProbeBatch(x.to(device), sigma.to(device), labels, cell_types, source)


def log_scores(
    loaded: LoadedModel, policy: PrecisionPolicy, batch: ProbeBatch
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sampler's log-score at active positions, (M, V') fp32, and log p0 for x0 models."""
    active = loaded.graph.active_positions(batch.x)  # (B, L) bool
    out = policy.forward(
        loaded.model, batch.x, batch.sigma, batch.labels, batch.cell_types, positions=active
    ).scores  # (M, V) fp32
    if loaded.model.parametrisation == "score":
        return out, None
    mask = loaded.graph.dim - 1
    log_p0 = torch.log_softmax(out[:, :mask], dim=-1)  # (M, V-1)
    sigma = batch.sigma[:, None].expand_as(batch.x)[active]  # (M,)
    return log_p0 - torch.log(torch.expm1(sigma))[:, None], log_p0


def score_error(
    loaded: LoadedModel, policy: PrecisionPolicy, baseline: PrecisionPolicy, batch: ProbeBatch
) -> dict[str, float]:
    """|log-score(policy) - log-score(fp32)|: max, mean, p99; mean KL(p0 fp32 || p0 policy)."""
    test, test_p0 = log_scores(loaded, policy, batch)
    ref, ref_p0 = log_scores(loaded, baseline, batch)
    diff = (test - ref).abs().flatten()
    if diff.numel() == 0:
        raise ValueError("the probe batch has no active positions; use more cells.")
    result = {
        "positions": float(test.shape[0]),
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "p99_abs": float(torch.quantile(diff[:1_000_000].double(), 0.99)),
    }
    if test_p0 is not None and ref_p0 is not None:
        kl = (ref_p0.exp() * (ref_p0 - test_p0)).sum(dim=-1)
        result["mean_kl_p0"] = float(kl.mean())
    return result


def _seconds_per_forward(loaded: LoadedModel, policy: PrecisionPolicy, batch: ProbeBatch) -> float:
    start = time.perf_counter()
    policy.forward(loaded.model, batch.x, batch.sigma, batch.labels, batch.cell_types)
    if policy.device.type == "cuda":
        torch.cuda.synchronize(policy.device)
    return time.perf_counter() - start


def speed(
    loaded: LoadedModel,
    policy: PrecisionPolicy,
    baseline: PrecisionPolicy,
    batch: ProbeBatch,
    repeats: int = 3,
) -> dict[str, float]:
    """Median seconds per forward of each, alternated after one warm-up each, and the ratio."""
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}.")
    times: dict[str, list[float]] = {"test": [], "fp32": []}
    for pol in (policy, baseline):
        _seconds_per_forward(loaded, pol, batch)
    for _ in range(repeats):
        times["test"].append(_seconds_per_forward(loaded, policy, batch))
        times["fp32"].append(_seconds_per_forward(loaded, baseline, batch))
    test, base = statistics.median(times["test"]), statistics.median(times["fp32"])
    return {
        f"{policy.name}_s_per_forward": test,
        "fp32_s_per_forward": base,
        "speed_ratio_vs_fp32": base / test,
        "repeats": float(repeats),
    }


def precision_report(
    loaded: LoadedModel,
    precision: str = "bf16",
    *,
    cells: int = 8,
    data: str | Path | None = None,
    label_key: str | None = None,
    repeats: int = 3,
    seed: int = 0,
    fold: bool = True,
) -> PrecisionReport:
    """Run all three probes for ``loaded`` under ``precision`` against fp32 on its device."""
    policy = resolve_precision(precision, loaded.device)
    baseline = resolve_precision("fp32", loaded.device)
    batch = probe_batch(loaded, cells=cells, data=data, label_key=label_key, seed=seed)
    notes = []
    if policy.amp_dtype is None:
        notes.append(f"precision {precision!r} resolved to fp32: the comparison is fp32 vs fp32.")
    if loaded.device.type == "cpu" and policy.name == "bf16":
        from sedd.precision import cpu_has_native_bf16

        if not cpu_has_native_bf16():
            notes.append("this CPU has no native bf16: bf16 is emulated, so it is slower here.")
    return PrecisionReport(
        policy=policy.record(),
        inputs={
            "source": batch.source,
            "cells": int(batch.x.shape[0]),
            "genes": int(batch.x.shape[1]),
            "masked_fraction": float((batch.x == loaded.graph.dim - 1).float().mean())
            if loaded.graph.absorb
            else 0.0,
            "seed": seed,
        },
        modules=module_dtypes(loaded.model, policy, batch, fold=fold),
        score_error=score_error(loaded, policy, baseline, batch),
        speed=speed(loaded, policy, baseline, batch, repeats),
        notes=notes,
    )
