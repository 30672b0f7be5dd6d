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
  ``server.ray.proxy_errors`` turns into the same JSON 429 with ``Retry-After``.
- ``--gpus-per-replica`` (fractions allowed) and ``--cpus-per-replica`` reserve Ray resources;
  each replica's torch uses ``--threads-per-replica`` threads (default: its CPUs).
- Without ``--ray-address`` a local Ray is started with its object store capped (Ray takes 30%
  of RAM otherwise; requests and responses here are small).

Shutdown drains like one process (``server.serve``): on SIGTERM/SIGINT every replica is told to
drain (Ray's broadcast), so new requests get the app's JSON 503 with ``Retry-After`` while the
requests in flight finish for up to ``drain_timeout_s``; then the jobs still running are failed
with JSON 503s, and Serve (and a Ray started here) shut down. A second signal cuts off at once.

Connections are Ray's proxy's, and get one process's protections there (``server.ray.proxy_http``):
the header timeout, body deadline, ``max_connections`` cap (per proxy) and JSON 400s.

Nothing in this module is imported by a plain ``sedd serve``: Ray is optional.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from typing import Any

import torch
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.app import create_app
from server.config import Settings
from server.http.protocol import KEEP_ALIVE_S
from server.metrics import merge_replicas
from server.ray import proxy_errors, proxy_http

log = logging.getLogger("sedd.server")
APP_NAME = "sedd"
OBJECT_STORE_BYTES = 256 * 2**20  # Ray's minimum is 75 MiB; our payloads are small
EXIT_GRACE_S = 3.0  # after the drain's cut: time for the cut requests' 503s to be answered
POLL_S = 0.1  # the drain asks the replicas for their in-flight counts this often
BROADCAST_TIMEOUT_S = 10.0


class RayMissing(ValueError):
    """``--replicas`` was asked for, but Ray Serve is not installed: a value this install cannot
    use (the CLI's one line and exit 2, as a missing PyYAML for a run's config is)."""


def replica_threads(settings: Settings) -> int:
    """Torch threads in each replica: ``threads_per_replica``, else its whole CPUs (at least 1)."""
    if settings.threads_per_replica is not None:
        return settings.threads_per_replica
    return max(1, math.floor(settings.cpus_per_replica))


_APP: list[FastAPI] = []  # the app this replica process serves (one)
_REPLICA: list[Any] = []  # this replica process's deployment instance (with --models)


def replica_app(settings: Settings, threads: int) -> FastAPI:
    """The app one replica serves (Ray calls this in the replica's process): responses carry
    ``x-sedd-replica``, and its /metrics gathers every replica's."""
    torch.set_num_threads(threads)
    app = create_app(settings)
    app.state.replica = _replica_id()
    app.state.gather_metrics = _gather_metrics
    app.add_middleware(ReplicaHeader, replica=app.state.replica)
    if settings.serves_many:  # every named model through Ray's multiplexing
        app.state.model_hook = _multiplexed
    _APP[:] = [app]
    return app


class SeddReplica:
    """One replica: the app's lifespan loads the model and starts its engine. ``run`` drains
    every replica through ``drain`` and ``cut`` (Ray's broadcast), as one process drains."""

    async def drain(self) -> int:
        """Take no new requests (they get the app's JSON 503 with ``Retry-After``, and
        ``/readyz`` says not ready); the count of requests still in flight here."""
        state = _APP[0].state
        state.draining = True
        host = getattr(state, "host", None)
        if host is not None:
            host.drain()
        return _in_flight(state)

    async def cut(self) -> int:
        """The drain's end: fail the jobs still running (their requests get the app's JSON 503
        at once); the count of requests still in flight here."""
        state = _APP[0].state
        await self.drain()
        host = getattr(state, "host", None)
        if host is not None:
            host.cut()
        return _in_flight(state)

    def metrics_text(self) -> tuple[str, bytes]:
        """(this replica's id, its metrics), for /metrics on any replica."""
        app = _APP[0]
        service = app.state.service
        text = service.metrics.render() if service is not None else b""
        return str(app.state.replica), text


async def _multiplexed(model_id: str) -> None:
    """Load ``model_id`` through the replica's ``@serve.multiplexed`` method, so that Ray's
    router knows this replica holds it (and Ray's LRU may give it up)."""
    if _REPLICA:
        await _REPLICA[0].model(model_id)


class HeldModel:
    """What Ray's multiplexer keeps for a model a replica holds; Ray calls ``__del__`` when its
    LRU gives the model up, and the host unloads it then, unless a request or job still holds
    it (the host's own LRU unloads it later)."""

    def __init__(self, host: Any, model_id: str) -> None:
        self.host, self.model_id = host, model_id

    async def __del__(self) -> None:
        try:
            self.host.unload(self.model_id)
        except Exception as err:  # in use, or the default model: it stays, and that is fine
            log.info("Ray's LRU gave up model %s; kept loaded here (%s)", self.model_id, err)


class MultiplexedReplica(SeddReplica):
    """A replica of ``sedd serve --replicas N --models DIR``: it loads a named model through a
    ``serve.multiplexed`` loader of at most ``most`` models (``max_loaded_models``), which is how
    Ray's router learns which replica holds which model (``server.ray.model_routing``). The
    loader is built here, in the replica, as Ray's docs allow for a wrapper set up at init: a
    class built elsewhere would reach Ray pickled with copies of this module's globals."""

    def __init__(self, most: int) -> None:
        async def held(model_id: str) -> HeldModel:
            host = _APP[0].state.host
            await host.get(model_id)
            return HeldModel(host, model_id)

        self.model = _serve().multiplexed(max_num_models_per_replica=most)(held)
        _REPLICA[:] = [self]


def _in_flight(state: Any) -> int:
    """Requests the app is answering (the guard's count; probes and scrapes excluded)."""
    return int(getattr(state, "in_flight", 0))


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


def replica_gpus(settings: Settings, gpus_in_cluster: float) -> float:
    """The GPUs each replica reserves. Unset: one where the cluster has GPUs (none with
    ``--device cpu``). Ray hides the GPUs from a replica that reserves none, so a replica given
    none on a GPU cluster would quietly serve from the CPU: refused unless ``--device cpu``
    asks for that (ValueError, one line)."""
    on_cpu = settings.device == "cpu"
    gpus = settings.gpus_per_replica
    if gpus is None:
        gpus = 1.0 if gpus_in_cluster > 0 and not on_cpu else 0.0
    if gpus == 0 and not on_cpu and (gpus_in_cluster > 0 or settings.device.startswith("cuda")):
        raise ValueError(
            f"--gpus-per-replica 0 on a Ray cluster with {gpus_in_cluster:g} GPU(s) (--device "
            f"{settings.device}): Ray hides the GPUs from such replicas and they would serve from "
            "the CPU; pass --gpus-per-replica 1 (or a fraction to share a GPU), or --device cpu "
            "to serve from CPU replicas on purpose"
        )
    if gpus > 0 and on_cpu:
        raise ValueError(
            f"--gpus-per-replica {gpus:g} with --device cpu reserves GPUs the replicas would not "
            "use; pass --gpus-per-replica 0, or leave --device out"
        )
    return gpus


def deployment_options(settings: Settings, gpus: float = 0.0) -> dict[str, Any]:
    """The Ray Serve deployment's options for these settings, each replica reserving ``gpus``
    (``replica_gpus``)."""
    most = settings.max_replicas if settings.replicas == "auto" else settings.replicas
    actor = {
        "num_cpus": settings.cpus_per_replica,
        "num_gpus": gpus,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(replica_threads(settings))}},
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
        # `run` drains the replicas first (drain_replicas); this bounds Ray's own wait for a
        # replica's requests at shutdown, e.g. one it replaces on a redeploy
        "graceful_shutdown_timeout_s": settings.drain_timeout_s,
    }
    if settings.replicas == "auto":
        found["autoscaling_config"] = {
            "min_replicas": settings.min_replicas,
            "max_replicas": settings.max_replicas,
            # scale up once a replica holds half its queue
            "target_ongoing_requests": max(1, settings.max_queued_jobs // 2),
        }
    else:
        found["num_replicas"] = settings.replicas
    return found


def application(settings: Settings, gpus: float = 0.0) -> Any:
    """The Ray Serve application: ``SeddReplica`` behind the app of ``server.app``, each
    replica reserving ``gpus``."""
    serve = _serve()
    threads = replica_threads(settings)

    def build() -> FastAPI:  # Ray builds the app in each replica: a function of no argument
        return replica_app(settings, threads)

    if not settings.serves_many:
        ingress = serve.ingress(build)(SeddReplica)
        return serve.deployment(**deployment_options(settings, gpus))(ingress).bind()
    ingress = serve.ingress(build)(MultiplexedReplica)
    deployment = serve.deployment(**deployment_options(settings, gpus))(ingress)
    return deployment.bind(settings.max_loaded_models)


def run(settings: Settings) -> None:
    """Start (or join) Ray, deploy the replicas, log the URL, and wait for SIGTERM/SIGINT;
    then drain every replica (``drain_replicas``) and shut Serve and a Ray we started down.
    A second signal cuts the requests still in flight off at once (exit status 1)."""
    serve = _serve()  # first: without Ray, one line that says how to install it
    import ray

    # Ray's proxy otherwise keeps draining for 30 s at shutdown, waiting for a load balancer
    # that would still send traffic; ours drain in the replicas (drain_timeout_s) first.
    os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1")
    # the proxy's own plain-text errors become JSON 503s that say to retry (a local Ray
    # inherits this; a cluster started with `ray start` needs it in its environment)
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", proxy_errors.IMPORT_PATH)
    # ... which also gives the proxy's connections one process's limits (server.ray.proxy_http)
    os.environ.update(proxy_http.environment(settings))
    started_ray = settings.ray_address is None
    if started_ray:
        ray.init(
            object_store_memory=OBJECT_STORE_BYTES,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    else:
        ray.init(address=settings.ray_address, logging_level=logging.WARNING)
    in_cluster = float(ray.cluster_resources().get("GPU", 0))
    try:
        gpus = replica_gpus(settings, in_cluster)
    except ValueError:
        if started_ray:
            ray.shutdown()
        raise
    signals = Signals()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signals.received)
    try:
        serve.start(http_options=http_options(settings))
        serve.run(application(settings, gpus), name=APP_NAME, route_prefix="/")
        count = "auto" if settings.replicas == "auto" else settings.replicas
        log.info(
            "serving %s with %s replica(s) on Ray, %g GPU(s) each (%g in the cluster), at "
            "http://%s:%d",
            settings.model,
            count,
            gpus,
            in_cluster,
            settings.host,
            settings.port,
        )
        print(f"sedd serve: ready at http://{settings.host}:{settings.port}", flush=True)
        signals.stop.wait()
        drain_replicas(settings.drain_timeout_s, signals.cut)
    finally:
        serve.shutdown()
        if started_ray:
            ray.shutdown()
    if signals.cut.is_set():
        raise SystemExit(1)


def http_options(settings: Settings) -> dict[str, Any]:
    """Ray's proxy options: where it listens, and idle connections closed after ``KEEP_ALIVE_S``
    as in one process (Ray's 90 s would meet the header timeout first, and its 408)."""
    return {"host": settings.host, "port": settings.port, "keep_alive_timeout_s": KEEP_ALIVE_S}


class Signals:
    """SIGTERM/SIGINT seen by ``run``: the first sets ``stop`` (drain), a second ``cut``."""

    def __init__(self) -> None:
        self.stop, self.cut = threading.Event(), threading.Event()

    def received(self, signum: int, frame: object) -> None:
        """The signal handler (runs in the main thread, between two bytecodes)."""
        (self.cut if self.stop.is_set() else self.stop).set()


def drain_replicas(timeout_s: float, cut: threading.Event) -> None:
    """Drain every replica as ``server.serve`` drains one process: each takes no new requests
    (JSON 503 with ``Retry-After``; Ray's proxy still routes them there), the requests in flight
    finish for up to ``timeout_s``, then the jobs still running are failed (JSON 503s) and their
    answers get ``EXIT_GRACE_S``. ``cut`` (a second signal) ends the wait at once."""
    handle = _serve().get_deployment_handle(APP_NAME, app_name=APP_NAME)
    busy = _broadcast_count(handle, "drain")
    log.info("draining: %d request(s) in flight, up to %g s", busy, timeout_s)
    deadline = time.monotonic() + timeout_s
    while busy > 0 and time.monotonic() < deadline and not cut.wait(POLL_S):
        busy = _broadcast_count(handle, "drain")  # also drains a replica Ray restarted
    if busy > 0:  # past the timeout, or a second signal: the jobs still running fail now
        log.warning("cutting off %d request(s) still in flight", busy)
        busy = _broadcast_count(handle, "cut")
        grace = time.monotonic() + EXIT_GRACE_S
        while busy > 0 and time.monotonic() < grace and not cut.wait(POLL_S):
            busy = _broadcast_count(handle, "drain")
    log.info("drained; %d request(s) still open; shutting down", busy)


def _broadcast_count(handle: Any, method: str) -> int:
    """Call ``method`` on every replica; the sum of the counts they answer (a replica that
    cannot answer, e.g. one that died, counts 0: it has nothing left to finish)."""
    try:
        answers = handle.broadcast(method).results(
            timeout_s=BROADCAST_TIMEOUT_S, return_exceptions=True
        )
    except Exception as err:  # no replica at all (e.g. every one is restarting)
        log.debug("%s reached no replica: %s", method, err)
        return 0
    return sum(a for a in answers if isinstance(a, int))


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise RayMissing(
            "--replicas needs Ray Serve: pip install -e '.[ray]' (or leave out --replicas for "
            "one process)."
        ) from None
    return serve
