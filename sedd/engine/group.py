"""Several models on one accelerator: one thread ticks one engine per model (``EngineGroup``).

Rows of different models never share a forward (each model has its own engine, sampler and row
blocks), so a cell's tokens are those of its model run alone: every engine is the engine of
``sedd.engine.core``, untouched. What the group adds is the sharing between models:

* **One loop.** A single thread sleeps on one condition (shared by every engine's queue) until
  any engine has work, then ticks each engine with work once, in turn, starting after the one
  it ticked first last time. Each model with work gets one tick a round, so a burst of requests
  on one model cannot starve another's: a small request on a quiet model waits at most one tick
  of each busy model before each of its own steps.
* **Admission sees the others.** An engine's admission and ``Retry-After`` price its ticks at
  its own forward time times its ``contention``: the seconds a round takes (the last busy tick of
  every engine with work) over its own tick's, so a request is refused, or told when to come
  back, as the other models' load really delays it.
* **Models come and go.** ``add`` starts ticking an engine; ``remove`` stops an engine that has
  no job queued or in flight (a model with work is never unloaded: ``EngineBusy``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

from sedd.engine.core import Engine
from sedd.engine.jobs import EngineStopped

log = logging.getLogger(__name__)


class EngineBusy(RuntimeError):
    """``EngineGroup.remove`` of an engine with jobs queued or in flight."""


class EngineGroup:
    """One thread ticking one engine per model (see the module docstring)."""

    def __init__(self) -> None:
        self.wake = threading.Condition(threading.Lock())  # every member engine's queue lock
        self._engines: dict[Hashable, Engine] = {}
        self._first = 0  # where the next round starts, for turns between models
        self._accepting, self._abort = True, False
        self._thread = threading.Thread(target=self._loop, name="sedd-engines", daemon=True)
        self._started = False

    def engine_options(self) -> dict[str, object]:
        """What ``Engine`` (or ``Engine.for_model``) must be built with to join this group."""
        return {"wake": self.wake}

    def add(self, key: Hashable, engine: Engine) -> None:
        """Tick ``engine`` (built with ``engine_options()``) from now on, under ``key``."""
        if engine.wake is not self.wake:
            raise ValueError("the engine was not built with this group's engine_options().")
        with self.wake:
            if not self._accepting:
                raise EngineStopped("the engine group was stopped; build a new one.")
            if key in self._engines:
                raise ValueError(f"an engine is already ticked under {key!r}.")
            self._engines[key] = engine
        engine.adopt(self._thread)
        engine.contention = lambda: self.contention(engine)

    def remove(self, key: Hashable) -> Engine:
        """Stop ticking the engine under ``key`` and return it (it takes no job from then on);
        ``EngineBusy``, and nothing changes, while it has a job queued or in flight."""
        with self.wake:
            engine = self._engines[key]
            if not engine.idle:
                raise EngineBusy(f"{key!r} has work queued or in flight.")
            engine.refuse_new_jobs()
            del self._engines[key]
        return engine

    def __contains__(self, key: Hashable) -> bool:
        with self.wake:
            return key in self._engines

    def start(self) -> None:
        """Start the ticking thread (once)."""
        with self.wake:
            if self._started:
                raise RuntimeError("the engine group is already running.")
            self._started = True
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def contention(self, engine: Engine) -> float:
        """A round's seconds over ``engine``'s own tick: 1 when it alone has work."""
        with self.wake:
            busy = [e for e in self._engines.values() if not e.idle and e is not engine]
        own = engine.last_busy_tick_s or engine.forward_seconds
        if not busy or not own:
            return 1.0
        others = sum(e.last_busy_tick_s or e.forward_seconds or own for e in busy)
        return 1.0 + others / own

    def _loop(self) -> None:
        while True:
            with self.wake:
                while self._accepting and not self._abort and self._all_idle():
                    self.wake.wait()
                if self._abort or self._all_idle():
                    return
                members = list(self._engines.values())
                start = self._first % len(members)
                self._first += 1
                turn = [e for e in members[start:] + members[:start] if not e.idle]
            for engine in turn:
                engine.tick_or_fail()

    def _all_idle(self) -> bool:
        return all(engine.idle for engine in self._engines.values())

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new jobs on any engine. With ``drain`` (and the thread started), finish the
        queued and in-flight jobs first, for up to ``timeout`` seconds; jobs left then get
        ``JobCancelled``."""
        with self.wake:
            self._accepting = False
            self._abort = self._abort or not drain
            engines = list(self._engines.values())
            for engine in engines:
                engine.refuse_new_jobs()
            self.wake.notify_all()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            with self.wake:
                self._abort = True
                self.wake.notify_all()
            self._thread.join()
        for engine in engines:
            engine.stop(drain=False)  # fails what is left with JobCancelled
