"""The models one server holds (``ModelHost``): ids, loading on first use, unloading LRU.

``sedd serve --model PATH`` serves one model under its folder's name, as it always did.
``sedd serve --models DIR`` serves every checkpoint of the repository ``DIR``
(``sedd.checkpoints.repository``), each under its id; a body's ``"model"`` picks one, a body
without it gets ``default_model``. The default model is loaded at start-up and never unloaded
(``/readyz`` is ready when it is); the others load on their first request, off the event loop,
while the request waits (its deadline counts from its arrival, so a slow load ends in a 504,
never in a request that overstays). At most ``max_loaded_models`` are loaded at once: to load
another, the least recently used model with no request and no job is unloaded; when every
loaded model is in use, the request gets a 503 with ``Retry-After``. A model with work in flight
is never unloaded.

Every model has its own ``Service`` (checkpoint, precision, engine); the engines are ticked by
one ``sedd.engine.group.EngineGroup``, so rows of different models never share a forward, each
model gets a tick a round, and admission prices a model's ticks with the others' in them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import torch

from sedd.checkpoints.repository import model_id_of, model_repository, named_models
from sedd.engine.group import EngineBusy, EngineGroup
from server.config import Settings
from server.errors import Draining, ModelInUse, ModelNotServed, ModelsBusy
from server.metrics import ServiceMetrics
from server.runner import warm_up
from server.service_loading import load_service
from server.state import Service

log = logging.getLogger("sedd.server")


class ModelHost:
    """The models of one app (see the module docstring)."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics) -> None:
        self.settings, self.metrics = settings, metrics
        if not settings.serves_many:
            self.paths = {model_id_of(settings.model): settings.model}
            self.skipped: dict[str, str] = {}
            self.default_id = next(iter(self.paths))
        else:
            found = None if settings.models is None else model_repository(settings.models)
            found = named_models(settings.model_map or {}, found)  # one of the two is given
            self.paths, self.skipped = found.models, found.skipped
            first = next(iter(settings.model_map or found.models))
            self.default_id = settings.default_model or first
            if self.default_id not in self.paths:
                raise ValueError(
                    f"default_model {self.default_id!r} is not a served model (ids: "
                    f"{', '.join(self.paths)}); pass one of them."
                )
        self.group = EngineGroup()
        self.services: OrderedDict[str, Service] = OrderedDict()  # least recently used first
        self.users: Counter[str] = Counter()  # requests holding each model now
        self.load_seconds: dict[str, float] = {}
        self._loading: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self.draining = False
        # Called with a named model's id before it is served: a Ray replica's multiplexed
        # loader (``server.ray.replicas``), so Ray's router knows where each model is loaded.
        self.load_hook: Callable[[str], Awaitable[None]] | None = None

    @property
    def ids(self) -> list[str]:
        return list(self.paths)

    @property
    def default(self) -> Service:
        return self.services[self.default_id]

    def load_now(self, model_id: str) -> Service:
        """Load ``model_id`` and add its engine to the group (blocking: a worker thread, or
        start-up). The default model feeds the app's monitor gauges."""
        settings = self.settings
        if settings.serves_many:  # side files belong to the one --model only
            update = {"model": self.paths[model_id], "genes": None, "perturbation_map": None}
            settings = settings.model_copy(update=update | {"vectors": None})
        service = load_service(
            settings,
            self.metrics,
            model_id=model_id,
            engine_options=self.group.engine_options(),
            monitored=model_id == self.default_id,
        )
        self.group.add(model_id, service.engine)
        self.services[model_id] = service
        return service

    async def get(self, model_id: str | None) -> Service:
        """The service of ``model_id`` (None: the default), loaded now if it is not."""
        model_id = self.default_id if model_id is None else model_id
        if model_id not in self.paths:
            raise ModelNotServed(model_id, self.ids)
        if (service := self.services.get(model_id)) is not None:
            self.services.move_to_end(model_id)
            return service
        if self.draining:
            raise Draining("the server is shutting down and loads no model")
        lock = self._locks.setdefault(model_id, asyncio.Lock())
        async with lock:
            if (service := self.services.get(model_id)) is not None:
                return service
            self._make_room(model_id)
            self._loading.add(model_id)
            started = time.monotonic()
            try:
                service = await asyncio.to_thread(self.load_now, model_id)
            finally:
                self._loading.discard(model_id)
            await warm_up(service)
            self.load_seconds[model_id] = time.monotonic() - started
            log.info("loaded model %s in %.1f s", model_id, self.load_seconds[model_id])
        return service

    @asynccontextmanager
    async def serving(self, model_id: str | None) -> AsyncIterator[Service]:
        """``get``, and the model held (never unloaded) until the block ends."""
        if model_id is not None and model_id in self.paths and self.load_hook is not None:
            await self.load_hook(model_id)
        service = await self.get(model_id)
        self.users[service.model_id] += 1
        try:
            yield service
        finally:
            self.users[service.model_id] -= 1

    def in_use(self, model_id: str) -> bool:
        service = self.services.get(model_id)
        busy = service is not None and not service.engine.idle
        return busy or self.users[model_id] > 0 or model_id in self._loading

    def _make_room(self, wanted: str) -> None:
        """Unload least recently used idle models until ``wanted`` fits the budget."""
        budget = self.settings.max_loaded_models
        while len(self.services) + len(self._loading) >= budget:
            idle = [m for m in self.services if m != self.default_id and not self.in_use(m)]
            if not idle:
                raise ModelsBusy(
                    f"model {wanted!r} is not loaded and the {budget} loaded models "
                    f"(max_loaded_models) all have work in flight; retry later, or send a "
                    f"loaded model's id ({', '.join(self.services)})"
                )
            self.unload(idle[0])

    def unload(self, model_id: str) -> None:
        """Unload ``model_id``: ``ModelInUse`` while a request or job holds it, or for the
        default model."""
        if model_id == self.default_id:
            raise ModelInUse(f"{model_id!r} is the default model, which stays loaded")
        if model_id not in self.services:
            return
        if self.in_use(model_id):
            raise ModelInUse(f"{model_id!r} has requests in flight; unload it when they end")
        try:
            self.group.remove(model_id)
        except EngineBusy as err:
            raise ModelInUse(f"{model_id!r} has requests in flight ({err})") from None
        service = self.services.pop(model_id)
        service.draining = True
        self.metrics.forget(model_id)
        device = service.loaded.device
        del service
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # the weights' memory back to the device for the next
        log.info("unloaded model %s", model_id)

    def drain(self) -> None:
        """Take no new work on any model (SIGTERM, Ray's drain)."""
        self.draining = True
        for service in self.services.values():
            service.draining = True

    def cut(self) -> None:
        """Fail every job still running, on every model (the drain's end, a second signal)."""
        self.drain()
        for service in list(self.services.values()):
            service.engine.cut()

    def stop(self, timeout: float | None) -> None:
        """Drain every model's jobs for up to ``timeout`` seconds, then stop the engines."""
        self.drain()
        self.group.stop(drain=True, timeout=timeout)

    def path(self, model_id: str) -> Path:
        return self.paths[model_id]
