"""Which cells a shard generates, and which shard this process is.

A request numbers its cells 0..N-1 (``sedd.request.plan.plan``). Shard k of n gets the
contiguous range ``shard_range(N, n, k)``; the first ``N % n`` shards get one cell more. Cell i
draws from its own random stream (seed, i), so the merged shards equal a one-shard run cell for
cell, whatever the shard count or batch size.

The shard count and index default to the SLURM job-array environment:
``SLURM_ARRAY_TASK_COUNT`` tasks, this one ``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN`` (array
ids need not start at 0: ``--array=1-4`` gives ids 1..4 and min 1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV_COUNT = "SLURM_ARRAY_TASK_COUNT"
ENV_ID = "SLURM_ARRAY_TASK_ID"
ENV_MIN = "SLURM_ARRAY_TASK_MIN"
# More shards than any array job runs (SLURM's MaxArraySize is at most 4,000,001, by default
# 1,001); a larger count is a typo or a damaged manifest, and would take minutes to even list.
MAX_SHARDS = 1_000_000


class ShardError(ValueError):
    """A shard setting (flag or SLURM environment) that cannot be used."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ShardError(f"the number of shards must be >= 1, got {self.count}.")
        if self.count > MAX_SHARDS:
            raise ShardError(
                f"the number of shards must be at most {MAX_SHARDS:,}, got {self.count}; "
                "run fewer, larger shards."
            )
        if not 0 <= self.index < self.count:
            raise ShardError(
                f"shard index must be in 0..{self.count - 1} for {self.count} shard(s), "
                f"got {self.index}."
            )

    @property
    def stem(self) -> str:
        """File stem, e.g. ``shard-00001-of-00004`` (sorts in shard order)."""
        return f"shard-{self.index:05d}-of-{self.count:05d}"

    def cell_range(self, num_cells: int) -> range:
        return shard_range(num_cells, self.count, self.index)


def shard_range(num_cells: int, num_shards: int, index: int) -> range:
    """The contiguous global cell numbers of shard ``index`` of ``num_shards``.

    Sizes differ by at most one cell; a shard may be empty when there are more shards than cells.
    """
    Shard(index, num_shards)  # validates
    if num_cells < 0:
        raise ShardError(f"the number of cells must be >= 0, got {num_cells}.")
    base, extra = divmod(num_cells, num_shards)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ShardError(f"environment variable {name} must be an integer, got {raw!r}.") from None


def resolve_shard(
    num_shards: int | None = None,
    shard_index: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Shard:
    """This process's shard: the flags if given, else the SLURM array environment, else 0 of 1.

    Each value falls back on its own: ``--num-shards 8`` inside an array job of 8 tasks takes the
    index from ``SLURM_ARRAY_TASK_ID``.
    """
    env = os.environ if env is None else env
    count_from_env = _env_int(env, ENV_COUNT)
    task_id = _env_int(env, ENV_ID)
    task_min = _env_int(env, ENV_MIN)
    if num_shards is None:
        num_shards = count_from_env if count_from_env is not None else 1
        count_source = ENV_COUNT if count_from_env is not None else "default"
    else:
        count_source = "--num-shards"
    if shard_index is None:
        if task_id is None:
            if num_shards > 1:
                raise ShardError(
                    f"{num_shards} shards ({count_source}) but no shard index: pass "
                    f"--shard-index K (0..{num_shards - 1}) or run as a SLURM array task "
                    f"({ENV_ID} set)."
                )
            shard_index = 0
        else:
            offset = task_min if task_min is not None else 0
            shard_index = task_id - offset
            if not 0 <= shard_index < num_shards:
                raise ShardError(
                    f"{ENV_ID}={task_id} minus {ENV_MIN}={offset} gives shard index "
                    f"{shard_index}, outside 0..{num_shards - 1} for {num_shards} shard(s) "
                    f"({count_source}). Use a contiguous array (e.g. --array=0-"
                    f"{num_shards - 1}) or pass --shard-index."
                )
    elif count_source == "default" and shard_index > 0:
        raise ShardError(
            f"--shard-index {shard_index} needs --num-shards (or {ENV_COUNT}); "
            "without it there is one shard."
        )
    return Shard(shard_index, num_shards)
