"""The one sampling loop: a step-level continuous-batching engine (``core.Engine``).

Every path that samples cells submits ``jobs.EngineJob`` s to an ``Engine``: the server from its
background thread, and the Python API, the CLI, shard jobs and ``sedd bench`` in-process through
``offline`` (vLLM's offline ``LLM`` drives the same ``LLMEngine`` its server does). ``rows`` packs
the in-flight rows of every job into one ``Sampler.step``.
"""

from sedd.engine.core import Engine
from sedd.engine.jobs import (
    EngineFull,
    EngineJob,
    EngineObserver,
    EngineStopped,
    InvalidTokensError,
    JobCancelled,
    JobHandle,
    JobLimits,
    JobProgress,
    JobResult,
    JobTimeout,
    is_out_of_memory,
)
from sedd.engine.offline import run_job, run_jobs

__all__ = [
    "Engine",
    "EngineFull",
    "EngineJob",
    "EngineObserver",
    "EngineStopped",
    "InvalidTokensError",
    "JobCancelled",
    "JobHandle",
    "JobLimits",
    "JobProgress",
    "JobResult",
    "JobTimeout",
    "is_out_of_memory",
    "run_job",
    "run_jobs",
]
