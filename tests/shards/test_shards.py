"""Shard ranges and the SLURM array defaults of ``--num-shards/--shard-index``."""

from __future__ import annotations

import pytest

from sedd.shards.ranges import Shard, ShardError, resolve_shard, shard_range


@pytest.mark.parametrize(("cells", "shards"), [(9, 4), (4, 4), (3, 5), (0, 2), (1000, 7)])
def test_shard_ranges_tile_the_cells_contiguously_and_evenly(cells: int, shards: int) -> None:
    ranges = [shard_range(cells, shards, k) for k in range(shards)]
    assert [i for r in ranges for i in r] == list(range(cells))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_nine_cells_in_four_shards() -> None:
    assert [shard_range(9, 4, k) for k in range(4)] == [
        range(0, 3),
        range(3, 5),
        range(5, 7),
        range(7, 9),
    ]
    assert Shard(1, 4).stem == "shard-00001-of-00004"


def test_defaults_come_from_the_array_environment_offset_by_its_minimum() -> None:
    env = {"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1"}
    assert resolve_shard(env=env) == Shard(3, 4)
    assert resolve_shard(env={"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "2"}) == Shard(
        2, 4
    )
    assert resolve_shard(env={}) == Shard(0, 1)
    assert resolve_shard(2, 1, env=env) == Shard(1, 2)  # flags win
    assert resolve_shard(8, None, env={"SLURM_ARRAY_TASK_ID": "5"}) == Shard(5, 8)


def test_bad_shard_settings_say_what_is_wrong() -> None:
    with pytest.raises(ShardError, match=r"SLURM_ARRAY_TASK_ID=7 minus SLURM_ARRAY_TASK_MIN=0"):
        resolve_shard(env={"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "7"})
    with pytest.raises(ShardError, match="SLURM_ARRAY_TASK_COUNT must be an integer, got 'x'"):
        resolve_shard(env={"SLURM_ARRAY_TASK_COUNT": "x"})
    with pytest.raises(ShardError, match="no shard index: pass --shard-index K"):
        resolve_shard(4, None, env={})
    with pytest.raises(ShardError, match=r"shard index must be in 0..3 for 4 shard\(s\), got 4"):
        resolve_shard(4, 4, env={})
    with pytest.raises(ShardError, match="must be >= 1, got 0"):
        resolve_shard(0, 0, env={})
    with pytest.raises(ShardError, match="--shard-index 2 needs --num-shards"):
        resolve_shard(None, 2, env={})
