"""GET /v1/models: the served model's card."""

from __future__ import annotations

from fastapi import APIRouter

from server.deps import AuthDep, ServiceDep
from server.limits import LimitedRoute
from server.schemas import ModelCard, ModelList

router = APIRouter(route_class=LimitedRoute, dependencies=[AuthDep], tags=["models"])


@router.get("/v1/models", response_model=ModelList, summary="The served model's card")
async def models(service: ServiceDep) -> ModelList:
    loaded, settings = service.loaded, service.settings
    cfg = loaded.config
    card = ModelCard(
        id=loaded.path.name,
        path=str(loaded.path),
        architecture=cfg.architecture,
        num_parameters=loaded.num_parameters,
        num_genes=cfg.num_genes,
        genes=list(cfg.genes),
        max_count=cfg.tokens.max_count,
        perturbations=loaded.conditions or None,
        control_label=cfg.control_label,
        cell_types=cfg.cell_types,
        checkpoint_sha256=loaded.file_hash,
        precision=service.precision.record(),  # type: ignore[arg-type]
        limits={
            "max_cells_per_request": settings.max_cells_per_request,
            "max_steps": settings.max_steps,
            "max_body_bytes": settings.max_body_bytes,
            "max_queued_jobs": settings.max_queued_jobs,
            "max_rows_per_forward": settings.max_rows_per_forward,
            "request_timeout_s": settings.request_timeout_s,
        },
    )
    return ModelList(data=[card])
