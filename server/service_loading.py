"""``load_service``: one model's checkpoint, precision policy and engine, as a ``Service``.

The app loads its default model this way at start-up (``server.app``), and ``ModelHost`` every
other model of a repository on its first request. The side files the settings name (gene
names, perturbation map, vectors: what ``sedd generate`` takes) load with the checkpoint.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from sedd.checkpoints import load_checkpoint
from sedd.checkpoints.labels import PositionalGenesWarning
from sedd.engine import Engine
from sedd.engine.monitor import Monitor
from sedd.precision import resolve_precision
from server.config import Settings
from server.metrics import RATE_WINDOW_S, ServiceMetrics
from server.state import Service

log = logging.getLogger("sedd.server")


def load_service(
    settings: Settings,
    service_metrics: ServiceMetrics,
    *,
    model_id: str,
    engine_options: dict[str, Any] | None = None,
    monitored: bool = True,
) -> Service:
    """Load ``settings.model`` as ``model_id``, build (not start) its engine with
    ``engine_options`` beside the settings' (an ``EngineGroup``'s), its series under
    ``model=<model_id>``, and, when ``monitored``, start the app's monitor on its device."""
    device = settings.resolved_device()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        loaded = load_checkpoint(
            settings.model,
            genes=settings.genes,
            perturbations=settings.perturbation_map,
            vectors=settings.vectors,
            device=device,
        )
        precision = resolve_precision(settings.precision, loaded.device)
    for warning in caught:
        if issubclass(warning.category, PositionalGenesWarning):  # how the server takes it
            log.warning("%s (sedd serve: --genes FILE or SEDD_GENES=FILE)", warning.message)
        else:
            log.warning("%s", warning.message)
    engine = Engine.for_model(
        loaded,
        precision,
        max_rows_per_forward=settings.max_rows_per_forward,
        tokens_per_forward=settings.tokens_per_forward,
        cuda_graphs=settings.cuda_graphs,
        max_queued_jobs=settings.max_queued_jobs,
        max_rows_in_flight=settings.rows_in_flight,
        fair=True,
        forward_cost_s=settings.forward_cost_s,
        whole_blocks=True,  # a full tick computes no padding rows
        **(engine_options or {}),
    )
    engine.observer = service_metrics.observe(model_id, engine, loaded.config.num_genes)
    if monitored:
        monitor = Monitor(loaded.device, loaded.config.num_genes, window_s=RATE_WINDOW_S).start()
        service_metrics.attach(monitor)
    return Service(settings, loaded, precision, engine, service_metrics, model_id=model_id)
