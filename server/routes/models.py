"""GET /v1/models and /v1/models/{id}: the served models' cards; with ``model_admin``, POST
/v1/models/{id}/load and /unload (behind the API key, as every route but /healthz)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from server.deps import HostDep
from server.errors import ModelNotServed
from server.http.limits import LimitedRoute
from server.model_host import ModelHost
from server.responses import ErrorBody, ModelCard, ModelList, UnloadedModel
from server.state import Service

router = APIRouter(route_class=LimitedRoute, tags=["models"])
_UNKNOWN = {404: {"model": ErrorBody, "description": "no served model has this id"}}


@router.get("/v1/models", response_model=ModelList, summary="The served models' cards")
async def models(host: HostDep) -> ModelList:
    return ModelList(data=[_entry(host, model_id) for model_id in host.ids])


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelCard | UnloadedModel,
    responses=_UNKNOWN,
    summary="One served model's card (OpenAI-style); a model not loaded now says so",
)
async def model(model_id: str, host: HostDep) -> ModelCard | UnloadedModel:
    if model_id not in host.paths:
        raise HTTPException(status_code=404, detail=str(ModelNotServed(model_id, host.ids)))
    return _entry(host, model_id)


@router.post(
    "/v1/models/{model_id}/load",
    response_model=ModelCard,
    responses={
        **_UNKNOWN,
        403: {"model": ErrorBody, "description": "model_admin is off"},
        503: {"model": ErrorBody, "description": "every loaded model is busy; see Retry-After"},
    },
    summary="Load a served model now (model_admin)",
)
async def load(model_id: str, host: HostDep) -> ModelCard:
    _admin(host)
    if model_id not in host.paths:
        raise HTTPException(status_code=404, detail=str(ModelNotServed(model_id, host.ids)))
    return _card(await host.get(model_id))


@router.post(
    "/v1/models/{model_id}/unload",
    response_model=UnloadedModel,
    responses={
        **_UNKNOWN,
        403: {"model": ErrorBody, "description": "model_admin is off"},
        409: {
            "model": ErrorBody,
            "description": "the model has work in flight, or is the default model",
        },
    },
    summary="Unload a served model now (model_admin); refused while it has work in flight",
)
async def unload(model_id: str, host: HostDep) -> UnloadedModel:
    _admin(host)
    if model_id not in host.paths:
        raise HTTPException(status_code=404, detail=str(ModelNotServed(model_id, host.ids)))
    host.unload(model_id)  # unloads it, or raises (in use: 409)
    return UnloadedModel(id=model_id, path=str(host.path(model_id)))


def _admin(host: ModelHost) -> None:
    if not host.settings.model_admin:
        raise HTTPException(
            status_code=403,
            detail="model loading and unloading over HTTP is off; start the server with "
            "--model-admin (SEDD_MODEL_ADMIN=1) to enable it",
        )


def _entry(host: ModelHost, model_id: str) -> ModelCard | UnloadedModel:
    service = host.services.get(model_id)
    if service is None:
        return UnloadedModel(
            id=model_id, path=str(host.path(model_id)), default=model_id == host.default_id
        )
    return _card(service)


def _card(service: Service) -> ModelCard:
    loaded, settings = service.loaded, service.settings
    cfg = loaded.config
    perturbation_model = cfg.label_kind == "perturbation"
    card = ModelCard(
        id=service.model_id or loaded.path.name,
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
