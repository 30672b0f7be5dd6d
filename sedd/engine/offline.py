"""Offline use of the engine: submit jobs and tick it in the caller's thread until they finish.

vLLM's offline ``LLM`` drives the same ``LLMEngine`` its server does; here the Python API, the CLI,
shard jobs and ``sedd bench`` drive the same ``Engine`` the server runs on its thread. Jobs are
fed lazily, so a million-cell run holds only the jobs in flight: enough rows wait in the queue to
refill every row freed at a step boundary, and no more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from sedd.diffusion.reference import StepProgress
from sedd.engine.core import Engine
from sedd.engine.jobs import EngineJob, JobHandle, JobResult

ProgressHook = Callable[[StepProgress], None]


def run_jobs(
    engine: Engine,
    jobs: Iterable[EngineJob],
    on_result: Callable[[int, JobResult], None],
    *,
    on_progress: ProgressHook | None = None,
) -> None:
    """Run ``jobs`` in order on ``engine``; ``on_result(k, result)`` sees job k's result.

    Results are handed over in submission order, each as soon as it and every earlier job are
    done, so the caller can write batch k to disk before batch k + 1 finishes. The engine is
    ticked here unless its background thread runs (then this waits on the jobs' futures).
    The first job that fails raises its error here, after the jobs still queued or in flight
    are cancelled.
    """
    pending: deque[tuple[int, JobHandle]] = deque()
    feed = iter(enumerate(jobs))
    exhausted = False
    try:
        while True:
            while not exhausted and _room(engine):
                item = next(feed, None)
                if item is None:
                    exhausted = True
                    break
                pending.append((item[0], engine.submit(item[1], on_progress)))
            while pending and (engine.running or pending[0][1].future.done()):
                index, handle = pending.popleft()
                on_result(index, handle.future.result())  # raises the job's error
            if exhausted and not pending:
                return
            if not engine.running and engine.tick() == 0 and not _any_done(pending):
                raise RuntimeError("the engine made no progress on its queued jobs.")
    except BaseException:
        _cancel(engine, [handle for _, handle in pending])
        raise


def run_job(engine: Engine, job: EngineJob, on_progress: ProgressHook | None = None) -> JobResult:
    """Run one job to completion (see ``run_jobs``) and return its result."""
    results: list[JobResult] = []
    run_jobs(engine, [job], lambda _, result: results.append(result), on_progress=on_progress)
    return results[0]


def engine_record(engine: Engine) -> dict[str, object]:
    """What an engine ran on, as every output records it: the rows and tokens of each model
    forward (its fixed shape, which decides the cells) and the most rows a tick steps."""
    shape = engine.forward_shape
    return {
        "block_rows": shape.rows,
        "tokens_per_forward": shape.tokens_per_forward,
        "rows_per_tick": engine.max_rows_per_forward,
    }


def _room(engine: Engine) -> bool:
    """Whether another job should wait in the queue: fewer rows wait than one tick can admit."""
    return (
        engine.queued_rows < engine.max_rows_per_forward
        and engine.queued_jobs < engine.max_queued_jobs
    )


def _any_done(pending: deque[tuple[int, JobHandle]]) -> bool:
    return any(handle.future.done() for _, handle in pending)


def _cancel(engine: Engine, handles: list[JobHandle]) -> None:
    """Cancel ``handles`` and let the engine drop their rows at its next boundary."""
    for handle in handles:
        handle.cancel()
    if not engine.running and handles:
        engine.tick()
