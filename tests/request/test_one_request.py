"""One request type, built once by every front door: the Python API, the CLI, shard jobs and the
server turn the same parameters into the same ``GenerationRequest`` and, through the one planning
call, the same ``EngineJob``; each plans a run's cells once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from server_client import make_settings
from server_models import PERTURBATIONS, save_tiny_model

import sedd.request.plan as plan_module
from sedd.api import Model
from sedd.checkpoints import load_checkpoint
from sedd.cli import _parse, main
from sedd.commands.output import request_from_args
from sedd.defaults import SamplingOptions
from sedd.engine import EngineJob
from sedd.precision import PrecisionPolicy
from sedd.request.plan import GenerationRequest, plan
from server.intake import plan_body, to_request, to_sampling
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
    sampling = SamplingOptions.resolve(4, None, sampler="analytic", temperature=0.8, seed=5)
    api = Model(loaded, FP32)._request(3, [condition], None, sampling)
    args = _parse(["generate", "--model", str(model_dir), "--conditions", condition,
                   "--cells", "3", "--steps", "4", "--sampler", "analytic", "--temperature",
                   "0.8", "--seed", "5", "--out", str(tmp_path / "cells.h5ad")])  # fmt: skip
    cli = request_from_args(args, cells_per_condition=args.cells, conditions=args.conditions)
    body = GenerateRequest(
        num_cells=3, condition=condition, steps=4, sampler="analytic", temperature=0.8, seed=5
    )
    settings = make_settings(model_dir)
    assert api == cli == to_request(body, loaded, settings)
    assert api == GenerationRequest(3, (condition,), None, sampling)
    assert api.sampling == sampling == to_sampling(body, settings)
    server = plan_body(loaded, settings, body)
    planned = plan(loaded, api)
    assert list(planned.cells.index) == list(plan(loaded, cli).cells.index)
    assert list(planned.cells.index) == list(server.cells.index)
    whole = planned.job()
    assert same_job(whole, plan(loaded, cli).job())
    assert same_job(whole, server.job)
    # shard jobs: the CLI's request, its cells split in two shards, each a slice of the whole
    shards = [job for cells in (range(0, 2), range(2, 3)) for _, job in planned.jobs(cells)]
    assert [j.first_cell for j in shards] == [0, 2]
    assert torch.equal(torch.cat([j.labels for j in shards]), whole.labels)
    assert all(j.sampling == whole.sampling for j in shards)


def test_each_front_door_plans_a_run_once(tmp_path: Path, monkeypatch):
    """The cell plan (names, labels, a sha256 run id) is built once per run, whichever door."""
    model_dir = save_tiny_model(tmp_path / "tiny")
    loaded = load_checkpoint(model_dir)
    builds: list[int] = []
    original = plan_module.cell_plan

    def counted(*args, **kwargs):
        frame = original(*args, **kwargs)
        builds.append(len(frame))
        return frame

    monkeypatch.setattr(plan_module, "cell_plan", counted)
    model = Model(loaded, FP32)
    condition = PERTURBATIONS[1]
    runs = {
        "api generate": lambda: model.generate(2, condition=condition, steps=2, progress=True),
        "api predict": lambda: model.predict([condition], cells_per_perturbation=1, steps=2),
        "cli generate": lambda: main(["generate", "--model", str(model_dir), "--conditions",
                                      condition, "--cells", "2", "--steps", "2", "--precision",
                                      "fp32", "--out", str(tmp_path / "one.h5ad")]),
        "cli shard": lambda: main(["generate", "--model", str(model_dir), "--conditions",
                                   condition, "--cells", "2", "--steps", "2", "--precision",
                                   "fp32", "--out-dir", str(tmp_path / "run"), "--num-shards",
                                   "2", "--shard-index", "1"]),
        "server": lambda: plan_body(
            loaded, make_settings(model_dir), GenerateRequest(num_cells=2, steps=2)
        ),
    }  # fmt: skip
    for door, run in runs.items():
        builds.clear()
        run()
        assert len(builds) == 1, f"{door} built the cell plan {len(builds)} times"
    assert builds == [2]
