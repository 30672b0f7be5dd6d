"""One request type, built once by every front door: the Python API, the CLI, shard jobs and the
server turn the same parameters into the same ``GenerationRequest`` and the same ``EngineJob``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from server_client import make_settings
from server_models import PERTURBATIONS, save_tiny_model

from sedd.api import Model
from sedd.checkpoints import load_checkpoint
from sedd.cli import _parse
from sedd.commands.output import request_from_args
from sedd.engine import EngineJob
from sedd.precision import PrecisionPolicy
from sedd.request.plan import GenerationRequest, SamplingOptions, cell_plan, job_for, jobs_for
from server.planning import plan_generate
from server.schemas import GenerateRequest

FP32 = PrecisionPolicy(device=torch.device("cpu"), amp_dtype=None)


def same_job(a: EngineJob, b: EngineJob) -> bool:
    for field in dataclasses.fields(EngineJob):
        if field.name == "deadline":  # the server's own timeout
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if x is None or y is None or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_every_front_door_builds_the_same_request_and_engine_job(tmp_path: Path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    loaded = load_checkpoint(model_dir)
    condition = PERTURBATIONS[2]
    sampling = SamplingOptions.resolve(
        4, None, sampler="analytic", temperature=0.8, seed=5, batch_size=64
    )
    api = Model(loaded, FP32)._request(3, [condition], None, sampling)
    args = _parse(["generate", "--model", str(model_dir), "--conditions", condition,
                   "--cells", "3", "--steps", "4", "--sampler", "analytic", "--temperature",
                   "0.8", "--seed", "5", "--out", str(tmp_path / "cells.h5ad")])  # fmt: skip
    cli = request_from_args(args, cells_per_condition=args.cells, conditions=args.conditions)
    body = GenerateRequest(
        num_cells=3, condition=condition, steps=4, sampler="analytic", temperature=0.8, seed=5
    )
    server = plan_generate(loaded, make_settings(model_dir), body)
    assert api == cli == GenerationRequest.of(3, [condition], None, sampling)
    assert (
        api.sampling
        == sampling
        == body.to_sampling()
        == dataclasses.replace(cli.sampling, batch_size=64)
    )
    plan = cell_plan(loaded, api)
    assert list(plan.index) == list(cell_plan(loaded, cli).index) == list(server.cells.index)
    whole = job_for(loaded, api, plan)
    assert same_job(whole, job_for(loaded, cli, cell_plan(loaded, cli)))
    assert same_job(whole, server.job)
    # shard jobs: the CLI's request, its cells split in two shards, each a slice of the whole
    shards = [job for cells in (range(0, 2), range(2, 3))
              for _, job in jobs_for(loaded, cli, plan, cells)]  # fmt: skip
    assert [j.first_cell for j in shards] == [0, 2]
    assert torch.equal(torch.cat([j.labels for j in shards]), whole.labels)
    assert all(j.seed == whole.seed and j.steps == whole.steps for j in shards)
