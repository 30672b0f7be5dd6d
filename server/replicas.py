"""``sedd serve --replicas N``: the same app as a Ray Serve deployment, one engine per replica.

Ray Serve (``pip install -e '.[ray]'``) runs N copies of the app of ``server.app`` behind its
HTTP proxy, which routes each request to the replica with the shorter queue. Each replica loads
the model once (the app's lifespan) and runs its own batching engine, so requests routed to one
replica still share its forwards; everything the app promises (the API key before the body,
strict JSON errors, 429 with ``Retry-After``, SSE, disconnect cancellation) is the app's own and
holds in every replica. A request's cells do not depend on the replica that served it: cell i
draws from stream (seed, i) on fixed row blocks, as in one process.

Sizing:

- ``max_ongoing_requests`` (Ray's cap per replica, 5 by default, which would starve continuous
  batching) is twice the app's ``max_queued_jobs``: a replica takes requests past its own queue
  and refuses them itself with the app's JSON 429. Ray's proxy holds at most
  ``max_queued_jobs`` more per replica, then answers with back-pressure, which
  ``server.proxy_errors`` turns into the same JSON 429 with ``Retry-After``.
- ``--gpus-per-replica`` (fractions allowed) and ``--cpus-per-replica`` reserve Ray resources;
  each replica's torch uses ``--threads-per-replica`` threads (default: its CPUs).
- Without ``--ray-address`` a local Ray is started with its object store capped (Ray takes 30%
  of RAM otherwise; requests and responses here are small).

Nothing in this module is imported by a plain ``sedd serve``: Ray is optional.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server import proxy_errors
from server.app import create_app
from server.config import Settings
from server.metrics import merge_replicas

log = logging.getLogger("sedd.server")
APP_NAME = "sedd"
OBJECT_STORE_BYTES = 256 * 2**20  # Ray's minimum is 75 MiB; our payloads are small


class RayMissing(RuntimeError):
    """``--replicas`` was asked for, but Ray Serve is not installed."""


@dataclass(frozen=True)
class ReplicaOptions:
    """How many replicas, on what, and which Ray cluster (``sedd serve --replicas``)."""

    replicas: int | None = 1  # None: autoscale between min_replicas and max_replicas
    min_replicas: int = 1
    max_replicas: int = 2
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    threads_per_replica: int | None = None  # None: the replica's CPUs, at least 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1 or auto, got {self.replicas}.")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"--min-replicas {self.min_replicas} and --max-replicas {self.max_replicas}: "
                "need 1 <= min <= max."
            )
        if self.gpus_per_replica < 0 or self.cpus_per_replica <= 0:
            raise ValueError(
                "--gpus-per-replica must be >= 0 and --cpus-per-replica > 0, got "
                f"{self.gpus_per_replica} and {self.cpus_per_replica}."
            )
        if self.threads_per_replica is not None and self.threads_per_replica < 1:
            raise ValueError(f"--threads-per-replica must be >= 1, got {self.threads_per_replica}.")

    @classmethod
    def of(cls, settings: Settings) -> ReplicaOptions:
        """The replica options of ``sedd serve``'s settings (``replicas`` set)."""
        return cls(
            replicas=None if settings.replicas == "auto" else settings.replicas,
            min_replicas=settings.min_replicas,
            max_replicas=settings.max_replicas,
            gpus_per_replica=settings.gpus_per_replica,
            cpus_per_replica=settings.cpus_per_replica,
            threads_per_replica=settings.threads_per_replica,
            ray_address=settings.ray_address,
        )

    @property
    def threads(self) -> int:
        if self.threads_per_replica is not None:
            return self.threads_per_replica
        return max(1, math.floor(self.cpus_per_replica))


_APP: list[FastAPI] = []  # the app this replica process serves (one)


def replica_app(settings: Settings, threads: int) -> FastAPI:
    """The app one replica serves (Ray calls this in the replica's process): responses carry
    ``x-sedd-replica``, and its /metrics gathers every replica's."""
    torch.set_num_threads(threads)
    app = create_app(settings)
    app.state.replica = _replica_id()
    app.state.gather_metrics = _gather_metrics
    app.add_middleware(ReplicaHeader, replica=app.state.replica)
    _APP[:] = [app]
    return app


class SeddReplica:
    """One replica: the app's lifespan loads the model and starts its engine."""

    def metrics_text(self) -> tuple[str, bytes]:
        """(this replica's id, its metrics), for /metrics on any replica."""
        app = _APP[0]
        service = app.state.service
        text = service.metrics.render() if service is not None else b""
        return str(app.state.replica), text


class ReplicaHeader:
    """ASGI middleware: every response says which replica served it (``x-sedd-replica``)."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (b"x-sedd-replica", replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, tagged)


async def _gather_metrics() -> bytes:
    """Every live replica's metrics, merged and labelled by replica (Ray's broadcast)."""
    serve = _serve()
    handle = serve.get_deployment_handle(APP_NAME, app_name=APP_NAME)
    answers = await handle.broadcast("metrics_text").results_async(
        timeout_s=10, return_exceptions=True
    )
    texts = dict(a for a in answers if isinstance(a, tuple))
    return merge_replicas(texts)


def _replica_id() -> str:
    try:
        return str(_serve().get_replica_context().replica_id.unique_id)
    except Exception:  # outside a replica (tests build the app directly)
        return f"pid{os.getpid()}"


def deployment_options(settings: Settings, options: ReplicaOptions) -> dict[str, Any]:
    """The Ray Serve deployment's options for these settings and replica options."""
    most = options.max_replicas if options.replicas is None else options.replicas
    actor = {
        "num_cpus": options.cpus_per_replica,
        "num_gpus": options.gpus_per_replica,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(options.threads)}},
    }
    found: dict[str, Any] = {
        "name": APP_NAME,
        "ray_actor_options": actor,
        "max_ongoing_requests": 2 * settings.max_queued_jobs,
        # past that, Ray's proxy holds at most one queue's worth per replica (requests wait
        # there while it picks a replica), then answers with back-pressure (our JSON 429)
        "max_queued_requests": settings.max_queued_jobs * most,
        "logging_config": {
            "log_level": settings.log_level.upper(),
            "enable_access_log": settings.log_level == "debug",
        },
        # a replica drains like one process: in-flight requests get drain_timeout_s
        "graceful_shutdown_timeout_s": settings.drain_timeout_s,
    }
    if options.replicas is None:
        found["autoscaling_config"] = {
            "min_replicas": options.min_replicas,
            "max_replicas": options.max_replicas,
            # scale up once a replica holds half its queue
            "target_ongoing_requests": max(1, settings.max_queued_jobs // 2),
        }
    else:
        found["num_replicas"] = options.replicas
    return found


def application(settings: Settings, options: ReplicaOptions) -> Any:
    """The Ray Serve application: ``SeddReplica`` behind the app of ``server.app``."""
    serve = _serve()
    threads = options.threads

    def build() -> FastAPI:  # Ray builds the app in each replica: a function of no argument
        return replica_app(settings, threads)

    ingress = serve.ingress(build)(SeddReplica)
    return serve.deployment(**deployment_options(settings, options))(ingress).bind()


def run(settings: Settings, options: ReplicaOptions) -> None:
    """Start (or join) Ray, deploy the replicas, log the URL, and wait for SIGTERM/SIGINT;
    then let every replica drain and shut Serve and a Ray we started down."""
    import ray

    serve = _serve()
    # Ray's proxy otherwise keeps draining for 30 s at shutdown, waiting for a load balancer
    # that would still send traffic; ours drain in the replicas (drain_timeout_s).
    os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1")
    # the proxy's own plain-text errors become JSON 503s that say to retry (a local Ray
    # inherits this; a cluster started with `ray start` needs it in its environment)
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", proxy_errors.IMPORT_PATH)
    started_ray = options.ray_address is None
    if started_ray:
        ray.init(
            object_store_memory=OBJECT_STORE_BYTES,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    else:
        ray.init(address=options.ray_address, logging_level=logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(application(settings, options), name=APP_NAME, route_prefix="/")
        count = "auto" if options.replicas is None else options.replicas
        log.info(
            "serving %s with %s replica(s) on Ray at http://%s:%d",
            settings.model,
            count,
            settings.host,
            settings.port,
        )
        print(f"sedd serve: ready at http://{settings.host}:{settings.port}", flush=True)
        stop.wait()
        log.info("shutting down: replicas drain for up to %g s", settings.drain_timeout_s)
    finally:
        serve.shutdown()
        if started_ray:
            ray.shutdown()


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise RayMissing(
            "--replicas needs Ray Serve: pip install -e '.[ray]' (or leave out --replicas for "
            "one process)."
        ) from None
    return serve
