"""What every output records about its request and model (API, CLI file, shard, server h5ad)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.io.write import provenance_uns
from sedd.precision import PrecisionPolicy
from sedd.request.draws import EXPECTED_LAYER, MEAN_LAYER
from sedd.request.plan import GenerationRequest


def run_provenance(
    loaded: LoadedModel,
    request: GenerationRequest,
    precision: PrecisionPolicy,
    stats: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    *,
    engine: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``uns`` every output of ``request`` records (API, CLI file, shard, server h5ad):
    the request, the model, the precision and ``engine``, what the engine ran on
    (``sedd.engine.engine_record``: rows and tokens a forward, rows a tick). Imputations
    also record how many genes were observed and which were dropped, and, with several draws,
    ``n_samples`` and the layer holding their mean (``mean_layer``); with ``expected``, the layer
    of expected counts (``expected_layer``)."""
    imputed = request.imputation
    if imputed is not None:
        observed = {"observed_genes": len(imputed.genes), "dropped_genes": imputed.dropped_genes}
        extra = {"imputation": observed, **(extra or {})}
    if request.n_samples != 1:  # absent for one draw: its output is what it always was
        draws = {"n_samples": request.n_samples, "mean_layer": MEAN_LAYER}
        extra = {**draws, **(extra or {})}
    if request.expected:  # absent when off: its output is what it always was
        extra = {"expected_layer": EXPECTED_LAYER, **(extra or {})}
    if request.sampling.sampler == "entropy":  # its bound, beside the sampler and cap (steps)
        extra = {"entropy_bound": request.sampling.entropy_bound, **(extra or {})}
    return provenance_uns(
        sampler=request.sampling.sampler,
        steps=request.sampling.steps,
        seed=request.sampling.seed,
        temperature=request.sampling.temperature,
        precision_record=precision.record(int(stats.get("fp32_fallbacks") or 0)),
        checkpoint_hash=loaded.file_hash,
        timings=stats,
        extra={
            "model": str(loaded.path),
            "request": request.record(),
            "engine": dict(engine),
            **model_provenance(loaded),
            **(extra or {}),
        },
    )


def model_provenance(loaded: LoadedModel) -> dict[str, Any]:
    """What every output records about the model's names: whether its genes are positions, the
    file that named them, and the obs column its labels were trained from."""
    return {
        "genes_by_position": loaded.config.genes_by_position,
        "genes_file": loaded.config.provenance.genes_file,
        "label_key": loaded.config.label_key,
    }
