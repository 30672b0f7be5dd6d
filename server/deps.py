"""Typed dependencies: the running service, its settings, and the API-key check."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.config import Settings
from server.errors import Draining, Unauthorized
from server.state import Service

_bearer = HTTPBearer(auto_error=False, description="the server's SEDD_API_KEY, when it has one")


def get_service(request: Request) -> Service:
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:  # between start-up and shutdown only; the lifespan sets it
        raise Draining("the model is not loaded (the server is starting or stopping)")
    return service


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


ServiceDep = Annotated[Service, Depends(get_service)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def require_api_key(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Every route but /healthz: the bearer key must match (constant-time), if one is set."""
    if settings.api_key is None:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer API key: send `Authorization: Bearer <key>`.")
    expected = settings.api_key.get_secret_value().encode()
    if not secrets.compare_digest(credentials.credentials.encode(), expected):
        raise Unauthorized("invalid API key.")


AuthDep = Depends(require_api_key)
