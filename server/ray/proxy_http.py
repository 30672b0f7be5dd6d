"""The connection protections of one process, in Ray Serve's HTTP proxy (``--replicas``).

A plain ``sedd serve`` speaks ``server.http.protocol.TimedH11Protocol``: a header timeout, a body
deadline, early answers closed, a connection cap and JSON 400s. Behind Ray Serve (2.60) the
connections are the proxy's: it runs its own uvicorn server with uvicorn's default protocol and
offers no setting for it. What it does offer is one call into our code in its process before that
server is built: the HTTP proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``,
``server.ray.proxy_errors.proxy_middlewares``). ``install`` runs there and names our protocol as
uvicorn's ``auto`` protocol in that process (Ray's proxy passes no ``http=`` of its own, so its
server loads ours), with the limits of the ``SEDD_*`` variables ``server.ray.replicas`` sets from
the settings before it starts a local Ray:

* ``SEDD_HEADER_TIMEOUT_S``: a head not complete in time gets a JSON 408 and is closed;
* ``SEDD_BODY_TIMEOUT_S``: a body that has not arrived in time is closed (JSON 408);
* ``SEDD_MAX_CONNECTIONS``: connections to this proxy past it get a JSON 503 with
  ``Retry-After`` (one cap per proxy, i.e. per Ray node);
* a request h11 cannot parse gets a JSON 400; an ``Upgrade`` header is ignored.

A cluster started with ``ray start`` needs these variables (and the callback's) in its own
environment; unset, the settings' defaults apply. This module runs in the proxy's process and
imports nothing heavy (no torch).
"""

from __future__ import annotations

import logging
import os
import sys

import uvicorn.config

from server.config import Settings
from server.http.protocol import TimedH11Protocol

log = logging.getLogger("sedd.server")
LIMITS = ("header_timeout_s", "body_timeout_s", "write_timeout_s", "max_connections")
PROXY_ACTOR = "SERVE_PROXY_ACTOR"  # Ray Serve names its proxy actors with this prefix
PROTOCOL: type[TimedH11Protocol] | None = None  # the proxy's protocol, once installed


def limits() -> dict[str, float | int]:
    """The connection limits from ``SEDD_<NAME>`` in this process's environment, else the
    settings' defaults."""
    found: dict[str, float | int] = {}
    for name in LIMITS:
        field = Settings.model_fields[name]
        kind = int if field.annotation is int else float
        given = os.environ.get(f"SEDD_{name.upper()}")
        found[name] = field.default if given is None else kind(given)
    return found


def environment(settings: Settings) -> dict[str, str]:
    """The variables that give a proxy these settings' limits, and their API key for Ray's own
    routes (``server.ray.proxy_errors.RayRoutesKey``), set before Ray starts."""
    found = {f"SEDD_{name.upper()}": str(getattr(settings, name)) for name in LIMITS}
    found["SEDD_MAX_BODY_BYTES"] = str(settings.max_body_bytes)  # model_routing reads bodies
    if settings.api_key is not None:
        found["SEDD_API_KEY"] = settings.api_key.get_secret_value()
    return found


def in_rays_proxy() -> bool:
    """Whether this process is Ray Serve's HTTP proxy actor (the only one ``install`` may
    change: uvicorn's protocol table is the whole process's)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    name = ray.get_runtime_context().get_actor_name() or ""
    return name.startswith(PROXY_ACTOR)


def install() -> type[TimedH11Protocol]:
    """Make uvicorn's ``auto`` protocol, in this process, ``TimedH11Protocol`` with
    ``limits()`` (idempotent); the protocol class."""
    global PROTOCOL
    if PROTOCOL is None:
        PROTOCOL = TimedH11Protocol.configured(**limits())  # type: ignore[arg-type]
        uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:PROTOCOL"
        log.info("Ray's proxy speaks server.http.protocol with %s", limits())
    return PROTOCOL
