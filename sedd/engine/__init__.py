"""The one sampling loop: a step-level continuous-batching engine (``core.Engine``).

Every path that samples cells submits ``jobs.EngineJob`` s to an ``Engine``: the server from its
background thread, and the Python API, the CLI, shard jobs and ``sedd bench`` in-process through
``offline`` (vLLM's offline ``LLM`` drives the same ``LLMEngine`` its server does). ``rows`` packs
the in-flight rows of every job into one step, proposed on the device with no host sync and
settled after one small readback a tick.

* A tick steps at most ``max_rows_per_forward`` rows. Offline (the default), admission is by
  rows, strictly FIFO, up to ``max_rows_in_flight`` (default the same) rows in flight: the head of
  the queue joins whole when it fits, else with as many rows as fit, and the rest join at later
  boundaries, each block on its own step; no job is overtaken. The server's engine is ``fair``:
  jobs start whole while fewer than ``max_rows_in_flight`` rows and ``max_rows_per_forward``
  jobs are in flight, and each tick's rows are shared max-min fairly between them
  (``sharing.fair_shares``), so a small job runs beside a big one. ``EngineFull.retry_after`` is
  the ticks until the head of the queue can start at today's shares, times a measured tick.
* Every model forward runs on blocks of exactly ``sampler.block_rows`` rows (decided in
  ``forwards``: ``tokens_per_forward // genes``, on CUDA also bounded by the free memory; reported
  by ``Engine.forward_shape``), the last block padded with copies of its last row. At a fixed
  shape each kernel (linear, attention, layer norm) computes a row the same way whatever the other
  rows hold or where the row sits, so a cell's tokens do not depend on its batch size, its packing
  with other jobs, its shard or the server's load (on one machine, thread count, precision, block
  size and torch version; ``tests/engine/test_batch_invariance.py``).
* Jobs whose conditioning differs in kind (index vs vector labels, with vs without cell types)
  cannot share a forward; each kind gets its own forward in the tick.
* Faults stay with their job. Randomness is counter-based (``sedd.diffusion.randomness``), so a
  failed step is retried by computing it again: nothing to save or restore. Out of memory: the rows
  are split in halves and retried, and a single job that still runs out alone fails with the error.
  Any other error (e.g. ``NonFiniteScoreError``, NaN/Inf left after the fp32 fallback): each job is
  retried alone and only those that fail again fail. A finished job holding a mask or out-of-range
  token fails (docs/precision.md rule 5). Nothing a job does stops the engine.
* The model runs only on the engine thread (``start``), or in the caller's ``tick`` before that.
  A progress hook's ``Exception`` is logged, never raised; a ``BaseException`` (a kill) is not.
"""

from sedd.diffusion.inputs import ModelLimits
from sedd.diffusion.reference import StepProgress
from sedd.engine.core import Engine
from sedd.engine.forwards import ForwardShape, block_rows_for, forward_rows, model_sampler
from sedd.engine.jobs import (
    BlockOutOfMemoryError,
    EngineFull,
    EngineJob,
    EngineObserver,
    EngineSettings,
    EngineStopped,
    InvalidTokensError,
    JobCancelled,
    JobHandle,
    JobResult,
    JobTimeout,
    is_out_of_memory,
)
from sedd.engine.offline import engine_record, run_job, run_jobs

__all__ = [
    "BlockOutOfMemoryError",
    "Engine",
    "EngineFull",
    "EngineJob",
    "EngineObserver",
    "EngineSettings",
    "EngineStopped",
    "ForwardShape",
    "InvalidTokensError",
    "JobCancelled",
    "JobHandle",
    "JobResult",
    "JobTimeout",
    "ModelLimits",
    "StepProgress",
    "block_rows_for",
    "engine_record",
    "forward_rows",
    "is_out_of_memory",
    "model_sampler",
    "run_job",
    "run_jobs",
]
