"""Step-level continuous batching: one engine per accelerator steps every request's rows together.

This is the only sampling loop in the codebase. The server ticks it on a background thread
(``start``); the Python API, the CLI, shard jobs and ``sedd bench`` tick it in their own thread
(``sedd.engine.offline``). Each ``tick`` is one step boundary: cancelled and timed-out jobs leave,
waiting rows join, and one packed step moves this tick's share of the rows in flight
(``sedd.engine.scheduler``) one step, each row on its own job's time grid, with its own settings
and random stream (``sedd.engine.job_state``), so its tokens are those of the same cell run alone.

A tick makes one host sync in the usual case: the step is proposed on the device for every kind
of conditioning, then one small (rows, 2) tensor comes back (rows whose output was not finite,
positions left to unmask), from which the host keeps its bookkeeping (finished rows, progress,
the masked fraction, the fp32 fallback). A finished job's tokens cross once, at its end.
Admission, fixed row blocks and faults: the package docstring (``sedd.engine``).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.diffusion.inputs import ModelLimits
from sedd.diffusion.reference import StepProgress
from sedd.diffusion.sampling import Sampler
from sedd.engine.admission import Workload
from sedd.engine.forwards import ForwardShape, model_sampler
from sedd.engine.job_state import JobState, RowBlock
from sedd.engine.jobs import (
    EngineJob,
    EngineObserver,
    EngineStopped,
    InvalidTokensError,
    JobCancelled,
    JobHandle,
    JobResult,
    outcome_of,
    validate_job,
)
from sedd.engine.queue import JobQueue
from sedd.engine.stepping import Stepper
from sedd.precision import PrecisionPolicy

log = logging.getLogger(__name__)


class Engine:
    """Continuous-batching sampler over one score model (see the module docstring).

    ``Engine.for_model(loaded, precision)`` serves a loaded checkpoint; the constructor takes a
    ``Sampler`` (the step maths) and the ``ModelLimits`` jobs are checked against.

    A tick steps at most ``max_rows_per_forward`` rows; jobs start while fewer than
    ``max_rows_in_flight`` rows (default: one tick's) are in flight, ``max_queued_jobs`` wait.
    ``fair`` shares each tick's rows max-min fairly between jobs (the server; ``sharing``).
    """

    @classmethod
    def for_model(
        cls,
        loaded: LoadedModel,
        precision: PrecisionPolicy,
        *,
        tokens_per_forward: int | None = None,
        cuda_graphs: bool | None = None,
        whole_blocks: bool = False,
        **options: Any,
    ) -> Engine:
        """An engine over ``loaded`` under ``precision`` on ``forwards.model_sampler``'s
        sampler (fixed row blocks, CUDA graphs); ``options`` as the constructor's. With
        ``whole_blocks``, ``max_rows_per_forward`` is rounded up to whole row blocks, so a full
        tick computes no padding rows (256 rows of 171-row blocks padded a full tick by 25%)."""
        sampler = model_sampler(loaded, precision, tokens_per_forward=tokens_per_forward,
                                cuda_graphs=cuda_graphs)  # fmt: skip
        if whole_blocks:
            asked, block = options.get("max_rows_per_forward", 256), sampler.block_rows
            options["max_rows_per_forward"] = -(-asked // block) * block
        return cls(sampler, ModelLimits.of_model(loaded), **options)

    def __init__(
        self,
        sampler: Sampler,
        limits: ModelLimits,
        *,
        max_rows_per_forward: int = 256,
        max_queued_jobs: int = 64,
        max_rows_in_flight: int | None = None,
        fair: bool = False,
        observer: EngineObserver | None = None,
        forward_cost_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wake: threading.Condition | None = None,
    ) -> None:
        """``forward_cost_s``: price admission and Retry-After at this many seconds a forward
        (a block) instead of the measured time, so they do not follow the machine's load (a
        shared node; tests). ``clock``: the monotonic clock of deadlines, queue waits and tick
        times (``time.monotonic``; a test may pass one it moves itself). ``wake``: a condition
        shared with other engines that one thread ticks (``sedd.engine.group.EngineGroup``)."""
        in_flight = max_rows_per_forward if max_rows_in_flight is None else max_rows_in_flight
        for name, value in (("max_rows_per_forward", max_rows_per_forward),
                            ("max_queued_jobs", max_queued_jobs),
                            ("max_rows_in_flight", in_flight)):  # fmt: skip
            if value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}.")
        self.sampler, self.limits, self.observer = sampler, limits, observer
        self.max_rows_per_forward, self.max_queued_jobs = max_rows_per_forward, max_queued_jobs
        self.max_rows_in_flight, self.fair = in_flight, fair
        if forward_cost_s is not None and not forward_cost_s > 0:
            raise ValueError(f"`forward_cost_s` must be > 0 (or None), got {forward_cost_s}.")
        self.clock, self.forward_cost_s = clock, forward_cost_s
        self._queue = JobQueue(max_queued_jobs, clock, wake)  # waiting and in-flight jobs, lock
        # Wall seconds of this engine's tick per its own busy seconds: more than 1 when other
        # engines' ticks run between its own (an ``EngineGroup`` sets it); prices admission.
        self.contention: Callable[[], float] = lambda: 1.0
        self.last_busy_tick_s: float | None = None  # the last tick that stepped rows, in seconds
        self._thread: threading.Thread | None = None
        self.forward_seconds: float | None = forward_cost_s  # one forward (a block), ``_time``
        self._forwards: deque[float] = deque(maxlen=9)
        self.last_tick_monotonic: float | None = None  # when the last tick ended
        self.tick_started_monotonic: float | None = None  # when the last (or current) began
        self._stepper = Stepper(sampler, self._finish, self._observe)

    def submit(
        self, job: EngineJob, on_progress: Callable[[StepProgress], None] | None = None
    ) -> JobHandle:
        """Queue ``job``. Raises ValueError (naming the field), EngineFull or EngineStopped.

        ``on_progress`` is called on the engine thread after every step of the job: keep it short
        (e.g. ``loop.call_soon_threadsafe``).
        """
        validate_job(job, self.limits, self.sampler.graph, self.sampler.denoise_mode)
        return self._queue.put(job, on_progress, self._retry_after)

    # ---- one step boundary -----------------------------------------------------------------

    def tick(self) -> int:
        """Drop ended jobs, admit waiting rows, step every in-flight row once; rows stepped."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the engine thread is running: only it may call tick().")
        start = self.tick_started_monotonic = self.clock()
        began = time.perf_counter()  # the forward's real time, whatever ``clock`` says
        queue = self._queue
        ended = queue.take_ended(start)
        joined = queue.admit(self.max_rows_per_forward, self.max_rows_in_flight, start,
                             fair=self.fair)  # fmt: skip
        for st, err in ended:
            self._finish(st, None, err)
        graph, device = self.sampler.graph, self.sampler.device
        for blk in joined:
            try:
                blk.state.materialise(graph, self.limits.num_genes, device)
            except Exception as err:  # e.g. out of memory for the job's tokens: that job only
                self._finish(blk.state, None, err)
        blocks = queue.select(self.max_rows_per_forward, fair=self.fair)  # this tick's rows
        if blocks:
            calls = self._stepper.model_calls
            self._stepper.step(blocks)
            self.last_busy_tick_s = time.perf_counter() - began
            self._time(self.last_busy_tick_s, self._stepper.model_calls - calls)
        # Timed before any job is handed back: whoever a result wakes (the server's warm-up)
        # finds this tick counted, and no time of it is written afterwards.
        self.last_tick_monotonic = self.clock()
        if blocks:
            self._retire(blocks)
        return sum(blk.rows for blk in blocks)

    def _time(self, seconds: float, calls: int) -> None:
        """One forward's time (a busy tick over its forwards), the median of the last ticks:
        what admission and Retry-After price a tick at (``workload``). A few ticks slowed by
        other work in the process (a large body parsed) do not move it."""
        if calls and self.forward_cost_s is None:
            self._forwards.append(seconds / calls)
            self.forward_seconds = statistics.median(self._forwards)

    def restart_timing(self) -> None:
        """Forget the measured forward time; the next busy ticks set it afresh. For a warm-up:
        its first ticks are cold and would overstate it for many ticks. A fixed
        ``forward_cost_s`` stays."""
        self.forward_seconds = self.forward_cost_s
        self._forwards.clear()

    def _retire(self, blocks: list[RowBlock]) -> None:
        """Drop finished rows (a block past its last step, or, under the absorbing graph, rows
        with every gene drawn: they leave at once and their room goes to waiting work), report
        progress, complete jobs whose rows are all done."""
        finished, active = self._queue.retire(blocks)  # job -> its rows done now
        stepped = {id(blk.state): blk.state for blk in blocks if not blk.state.done}
        for st in stepped.values():
            if st.on_progress is not None:
                rows = sum(blk.rows for blk in blocks if blk.state is st)
                mine = [blk for blk in active if blk.state is st]
                self._report(st, mine, rows, finished.get(id(st), 0))
        for st in stepped.values():
            if st.rows_done == st.job.num_cells:
                self._complete(st)

    def _report(self, st: JobState, mine: list[RowBlock], rows: int, finished: int) -> None:
        try:
            st.on_progress(st.progress(mine, self.sampler.graph, rows, finished))  # type: ignore[misc]
        except Exception:  # a caller's hook must not stop the engine
            log.exception("on_progress of job %d raised", st.handle.job_id)

    def _complete(self, st: JobState) -> None:
        tokens = st.x.cpu()  # (N, G): the job's result crosses to the host once
        graph = self.sampler.graph
        # Without the final denoise masks may remain (the caller asked for that); never beyond.
        real = graph.dim - 1 if graph.absorb and st.job.denoise else graph.dim
        values = tokens.numpy()
        if values.size and (values.min() < 0 or values.max() >= real):
            bad = InvalidTokensError(
                f"job {st.handle.job_id} ended with mask or out-of-range tokens; they are not "
                "returned (docs/precision.md rule 5)."
            )
            self._finish(st, None, bad)
            return
        now = self.clock()
        started = st.started if st.started is not None else now
        drawn = st.to_draw - int(st.active.sum()) if st.absorbing else 0
        expected = None if st.expected is None else st.expected.cpu()  # with the cells, once
        result = JobResult(tokens, started - st.submitted, now - started, st.forwards,
                           st.fallbacks, st.row_forwards, drawn, expected)  # fmt: skip
        self._finish(st, result, None)

    def _finish(self, st: JobState, result: JobResult | None, err: Exception | None) -> None:
        """Resolve a job's future (once), drop its rows and tell the observer."""
        if st.done:
            return
        st.done = True
        self._queue.remove(st)
        outcome = outcome_of(err)
        # Observe first: whoever waits on the future must find the job already counted.
        self._observe("on_job_done", st.job, result, outcome)
        try:
            if err is None:
                st.handle.future.set_result(result)  # type: ignore[arg-type]
            else:
                st.handle.future.set_exception(err)
        except InvalidStateError:  # the caller cancelled the future itself
            pass

    def _observe(self, hook: str, *args: object) -> None:
        if (fn := getattr(self.observer, hook, None)) is None:
            return
        try:
            fn(*args)
        except Exception:  # monitoring must not stop the engine
            log.exception("observer %s raised", hook)

    def _retry_after(self) -> float:
        """Seconds until a queued job can start, so one more can queue (an estimate,
        ``Workload.room_seconds``); 1 s before a forward has been timed."""
        seconds = self.forward_seconds
        if seconds is None:
            return 1.0
        workload, groups = self._snapshot(seconds)
        return workload.room_seconds(groups)

    def ticks_until_room(self) -> int:
        """Ticks until the head of the queue can start (``EngineFull.retry_after``'s)."""
        workload, groups = self._snapshot(0.0)
        return workload.room_ticks(groups)

    # ---- the background thread -------------------------------------------------------------

    def start(self) -> None:
        """Loop ``tick`` on a background thread, which sleeps on a condition while idle."""
        with self._queue.lock:
            if not self._queue.accepting:
                raise EngineStopped("the engine was stopped; build a new one.")
            if self._thread is not None:
                raise RuntimeError("the engine is already running.")
            self._thread = threading.Thread(target=self._loop, name="sedd-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        queue = self._queue
        while True:
            with queue.lock:
                while queue.accepting and not queue.abort and queue.idle():
                    queue.wake.wait()
                if queue.abort or queue.idle():
                    return
            self.tick_or_fail()

    def tick_or_fail(self) -> None:
        """``tick``; an error there (a bookkeeping bug) fails the jobs running, and no more."""
        try:
            self.tick()
        except Exception as err:
            log.exception("engine tick failed")
            running = [st for st in self._queue.states() if st.started is not None]
            for st in running:
                self._finish(st, None, err)

    def adopt(self, thread: threading.Thread) -> None:
        """Be ticked by ``thread`` (an ``EngineGroup``'s) instead of a thread of its own."""
        with self._queue.lock:
            if self._thread is not None:
                raise RuntimeError("the engine is already running.")
            self._thread = thread

    @property
    def wake(self) -> threading.Condition:  # the ticking thread's sleep; its lock: the queue's
        return self._queue.wake

    def refuse_new_jobs(self) -> None:  # from now on (the caller holds ``wake``)
        self._queue.accepting = False

    @property
    def idle(self) -> bool:  # no job queued or in flight (the caller may hold ``wake``)
        return self._queue.idle()

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new jobs. With ``drain``, finish the queued and in-flight jobs first (for up
        to ``timeout`` seconds); jobs still left then get ``JobCancelled``. Idempotent."""
        queue = self._queue
        with queue.lock:
            queue.accepting = False
            queue.abort = queue.abort or not drain
            queue.wake.notify_all()
            thread = self._thread
        deadline = None if timeout is None else time.monotonic() + timeout  # real seconds
        # (an adopted thread, an ``EngineGroup``'s, may not have started: nothing to join)
        if (
            thread is not None
            and thread.ident is not None
            and thread is not threading.current_thread()
        ):
            thread.join(timeout)
            with queue.lock:
                queue.abort = True  # the drain ran out of time: stop at the next boundary
                queue.wake.notify_all()
            thread.join()
        elif thread is None and drain:
            while queue.states() and (deadline is None or time.monotonic() < deadline):
                self.tick()
        for st in queue.states():
            self._finish(st, None, JobCancelled(f"job {st.handle.job_id}: the engine stopped."))

    def workload(self) -> Workload | None:
        """The jobs in flight and queued as row counts, with the limits and the measured
        forward time (``sedd.engine.admission``); None before a forward has been timed."""
        seconds = self.forward_seconds
        return None if seconds is None else self._snapshot(seconds)[0]

    def _snapshot(self, forward_seconds: float) -> tuple[Workload, list[list[RowBlock]]]:
        """The workload now, priced at ``forward_seconds`` a forward, and the blocks in flight
        by job, taken together."""
        running, waiting, groups = self._queue.snapshot(self.clock())
        forward_seconds *= max(1.0, self.contention())
        block = self.sampler.block_rows or self.max_rows_per_forward
        workload = Workload(running, waiting, self.max_rows_per_forward, self.max_rows_in_flight,
                            self.fair, forward_seconds, block)  # fmt: skip
        return workload, groups

    def cut(self) -> None:
        """Stop now, from any thread: fail every queued and in-flight job at once with
        ``EngineStopped`` (a step under way finishes and is dropped). Idempotent."""
        queue = self._queue
        with queue.lock:
            queue.accepting = False
            queue.abort = True
            queue.wake.notify_all()
        for st in queue.states():
            self._finish(st, None, EngineStopped(f"job {st.handle.job_id}: the engine stopped."))

    @property
    def queued_jobs(self) -> int:
        return self._queue.queued_jobs

    @property
    def queued_rows(self) -> int:  # submitted, not yet admitted
        return self._queue.queued_rows

    @property
    def active_jobs(self) -> int:
        return self._queue.active_jobs

    @property
    def active_rows(self) -> int:
        return self._queue.active_rows

    @property
    def readbacks(self) -> int:  # device-to-host reads of step results: one a tick, as a rule
        return self._stepper.readbacks

    @property
    def forward_shape(self) -> ForwardShape:  # what every model forward runs on (provenance)
        return ForwardShape.of(self.sampler.block_rows, self.limits.num_genes)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
