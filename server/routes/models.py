"""GET /v1/models and /v1/models/{id}: the served model's card."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from server.deps import ServiceDep
from server.http.limits import LimitedRoute
from server.responses import ErrorBody, ModelCard, ModelList
from server.state import Service

router = APIRouter(route_class=LimitedRoute, tags=["models"])


@router.get("/v1/models", response_model=ModelList, summary="The served model's card")
async def models(service: ServiceDep) -> ModelList:
    return ModelList(data=[_card(service)])


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelCard,
    responses={404: {"model": ErrorBody, "description": "no served model has this id"}},
    summary="One served model's card (OpenAI-style)",
)
async def model(model_id: str, service: ServiceDep) -> ModelCard:
    card = _card(service)
    if model_id != card.id:
        raise HTTPException(
            status_code=404,
            detail=f"no served model is called {model_id!r}; this server serves {card.id!r} "
            "(GET /v1/models lists it).",
        )
    return card


def _card(service: Service) -> ModelCard:
    loaded, settings = service.loaded, service.settings
    cfg = loaded.config
    perturbation_model = cfg.label_kind == "perturbation"
    card = ModelCard(
        id=loaded.path.name,
        path=str(loaded.path),
        architecture=cfg.architecture,
        num_parameters=loaded.num_parameters,
        num_genes=cfg.num_genes,
        genes=list(cfg.genes),
        max_count=cfg.tokens.max_count,
        label_kind=cfg.label_kind,
        label_key=cfg.label_key,
        conditions=loaded.conditions or None,
        default_condition=cfg.control_label if loaded.conditional else None,
        perturbations=(loaded.conditions or None) if perturbation_model else None,
        control_label=cfg.control_label if perturbation_model else None,
        cell_types=cfg.cell_types,
        checkpoint_sha256=loaded.file_hash,
        precision=service.precision.record(),  # type: ignore[arg-type]
        limits={
            "max_cells_per_request": settings.max_cells_per_request,
            "max_steps": settings.max_steps,
            "max_body_bytes": settings.max_body_bytes,
            "max_queued_jobs": settings.max_queued_jobs,
            "max_rows_per_forward": settings.max_rows_per_forward,
            "max_rows_in_flight": settings.rows_in_flight,
            **({"max_cell_steps": settings.max_cell_steps} if settings.max_cell_steps else {}),
            "request_timeout_s": settings.request_timeout_s,
        },
        default_schedule=loaded.schedule.record(),
        schedule_calibrated=loaded.calibrated,
    )
    return card
