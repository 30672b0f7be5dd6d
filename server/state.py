"""What the app holds for each model it serves: the checkpoint, its precision policy and engine,
and the app's metrics (``server.model_host.ModelHost`` holds one per loaded model)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sedd.checkpoints import LoadedModel
from sedd.engine import Engine
from sedd.precision import PrecisionPolicy
from server.config import Settings
from server.metrics import ServiceMetrics


@dataclass
class Service:
    """Built by the lifespan at start-up; routes reach it through ``server.deps``."""

    settings: Settings
    loaded: LoadedModel
    precision: PrecisionPolicy
    engine: Engine
    metrics: ServiceMetrics
    draining: bool = field(default=False)
    model_id: str = ""  # its id among the server's models (``server.model_host``)

    def precision_record(self, fp32_fallbacks: int) -> dict[str, object]:
        """The policy's record with this request's own fallback count."""
        return self.precision.record(fp32_fallbacks)
