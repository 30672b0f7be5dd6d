"""The OpenAPI schema as served: the generic one FastAPI builds from ``server.schemas``, with the
server's real limits and the served model's names written in (``apply_limits``), and the API key
described as the guard checks it (``apply_auth``), so clients, ``/docs`` and schemathesis see what
can succeed.
"""

from __future__ import annotations

from typing import Any

from sedd.checkpoints.schema import ModelConfig
from server.config import Settings
from server.http.guard import OPEN_PATHS

BEARER = "HTTPBearer"  # the scheme's name, as FastAPI's own HTTPBearer names it
BEARER_DESCRIPTION = "the server's SEDD_API_KEY, when it has one"


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """The schema of an optional field's value (its non-null ``anyOf`` branch)."""
    if "anyOf" in prop:
        return next(p for p in prop["anyOf"] if p.get("type") != "null")
    return prop


def apply_limits(
    schema: dict[str, Any], settings: Settings, config: ModelConfig | None = None
) -> dict[str, Any]:
    """Write the server's limits and the served model's names into the OpenAPI ``schema`` (in
    place; returned), so a client sees which values can succeed."""
    components = schema.get("components", {}).get("schemas", {})

    def prop(model: str, field: str) -> dict[str, Any] | None:
        return components.get(model, {}).get("properties", {}).get(field)

    for model in ("GenerateRequest", "PredictRequest", "ImputeRequest"):
        for field, limit in (
            ("steps", settings.max_steps),
            ("timeout_s", settings.request_timeout_s),
        ):
            if (found := prop(model, field)) is not None:
                _non_null(found)["maximum"] = limit
    cells = settings.max_cells_per_request
    for model, field, key in (
        ("GenerateRequest", "num_cells", "maximum"),
        ("PredictRequest", "cells_per_perturbation", "maximum"),
        ("ImputeRequest", "counts", "maxItems"),
    ):
        if (found := prop(model, field)) is not None:
            found[key] = cells
    if config is not None:
        _apply_model_names(prop, config)
    return schema


def _apply_model_names(prop: Any, config: ModelConfig) -> None:
    names, cell_types = config.perturbations, config.cell_types
    for model in ("GenerateRequest", "PredictRequest", "ImputeRequest"):
        condition, cell_type = prop(model, "condition"), prop(model, "cell_type")
        if condition is not None and names is not None:
            _non_null(condition)["enum"] = [name for name in names if name is not None]
        if cell_type is not None and cell_types:
            _non_null(cell_type)["enum"] = list(cell_types)
        elif cell_type is not None:  # a model without cell types takes none
            _only_null(cell_type)
    if (found := prop("ImputeRequest", "cell_types")) is not None:
        if cell_types:
            _non_null(found)["items"]["enum"] = list(cell_types)
        else:
            _only_null(found)
    if (found := prop("PredictRequest", "perturbations")) is not None and names is not None:
        found["items"]["enum"] = list(names)
        found.update(maxItems=len(names), uniqueItems=True)
    if (found := prop("ImputeRequest", "genes")) is not None:  # unknown genes are dropped
        found.update(uniqueItems=True)
    if (found := prop("ImputeRequest", "counts")) is not None:  # larger ones need "clip"
        found["items"]["items"]["maximum"] = config.tokens.max_count


def _only_null(prop: dict[str, Any]) -> None:
    """An optional field that must be left out (or null) for this model."""
    prop.pop("anyOf", None)
    prop["type"] = "null"


def apply_auth(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Say in the OpenAPI ``schema`` (in place; returned) what the API key really does. The key is
    checked in one place, before routing (``server.http.guard``), on every path but its
    ``OPEN_PATHS``; here those same paths are described: with a key set, every other operation
    is secured by a bearer scheme and lists its 401 (padlocks in /docs); with none, no operation
    is secured and none lists a 401."""
    keyed = settings.api_key is not None
    unauthorized = {"description": "missing or wrong API key", "content": _error_content()}
    for where, path in schema.get("paths", {}).items():
        if where in OPEN_PATHS:
            continue
        for operation in path.values():
            responses = operation.setdefault("responses", {})
            if keyed:
                operation["security"] = [{BEARER: []}]
                responses.setdefault("401", unauthorized)
            else:
                responses.pop("401", None)
    if keyed:
        schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes[BEARER] = {"type": "http", "scheme": "bearer", "description": BEARER_DESCRIPTION}
    return schema


def _error_content() -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
