"""What the app holds while it runs: one model, one precision policy, one engine, metrics."""

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

    def precision_record(self, fp32_fallbacks: int) -> dict[str, object]:
        """The policy's record with this request's own fallback count."""
        return self.precision.record(fp32_fallbacks)
