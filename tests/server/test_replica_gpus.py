"""Ray replicas on a GPU node run on its GPUs (issue "The first H100 run, round 2", item 3):
``gpus_per_replica`` defaulted to 0, so Ray hid the GPUs and ``sedd serve --replicas N`` quietly
served from CPU replicas. Now an unset value is one GPU a replica where the cluster has GPUs,
and a replica without a GPU on a GPU cluster is refused unless ``--device cpu`` asks for it.
(Decided before Ray deploys anything: no Ray needed here; CI's Ray step runs the replicas.)"""

from __future__ import annotations

import re

import pytest
from server_client import make_settings

from sedd.defaults import DEFAULT_MODEL
from server.ray.replicas import deployment_options, replica_gpus


def _settings(**overrides: object):
    return make_settings(DEFAULT_MODEL, **{"device": "auto", "replicas": 2, **overrides})


@pytest.mark.parametrize(
    ("overrides", "in_cluster", "gpus"),
    [
        ({}, 8, 1.0),  # a GPU node: one GPU each by default
        ({}, 0, 0.0),  # a CPU node: CPU replicas
        ({"gpus_per_replica": 0.5}, 8, 0.5),  # two replicas share a GPU
        ({"device": "cpu"}, 8, 0.0),  # CPU replicas on a GPU node, asked for
        ({"device": "cpu", "gpus_per_replica": 0}, 8, 0.0),
    ],
)
def test_the_gpus_each_replica_reserves(overrides: dict, in_cluster: float, gpus: float) -> None:
    settings = _settings(**overrides)
    assert replica_gpus(settings, in_cluster) == gpus
    assert deployment_options(settings, gpus)["ray_actor_options"]["num_gpus"] == gpus


@pytest.mark.parametrize(
    ("overrides", "in_cluster", "message"),
    [
        ({"gpus_per_replica": 0}, 8, "--gpus-per-replica 0 on a Ray cluster with 8 GPU(s)"),
        (
            {"device": "cuda"},
            0,
            "--gpus-per-replica 0 on a Ray cluster with 0 GPU(s) (--device cuda)",
        ),
        ({"device": "cpu", "gpus_per_replica": 1}, 8, "--gpus-per-replica 1 with --device cpu"),
    ],
)
def test_a_replica_that_would_not_use_the_gpus_is_refused_in_one_line(
    overrides: dict, in_cluster: float, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        replica_gpus(_settings(**overrides), in_cluster)
    assert "\n" not in str(err.value)
