"""Typed dependencies: the running default model's service, and the host of every model.

The API key is not a dependency: ``server.http.guard`` checks it once, before routing (and before
a body is read), and ``server.openapi.apply_auth`` describes that check in the schema.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from server.errors import Draining
from server.model_host import ModelHost
from server.state import Service


def get_service(request: Request) -> Service:
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:  # between start-up and shutdown only; the lifespan sets it
        raise Draining("the model is not loaded (the server is starting or stopping)")
    return service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_host(request: Request) -> ModelHost:
    host: ModelHost | None = getattr(request.app.state, "host", None)
    if host is None or getattr(request.app.state, "service", None) is None:
        raise Draining("the models are not loaded (the server is starting or stopping)")
    return host


HostDep = Annotated[ModelHost, Depends(get_host)]
