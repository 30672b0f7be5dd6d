"""The shape of the engine's model forwards (``sedd.engine.forwards``): decided in one place, and
reported as what the forwards ran on (``Engine.forward_shape``, for provenance)."""

from __future__ import annotations

import pytest
import torch
from devices import DEVICE
from engine_models import FP32, GENES, LOADED, PERTS, job, run_until_idle

from sedd.diffusion.sampling import Sampler
from sedd.engine import Engine, ForwardShape, ModelLimits
from sedd.engine.forwards import block_rows_for, forward_rows, model_sampler


@pytest.mark.parametrize(
    ("tokens", "rows"),
    [(None, block_rows_for(GENES, DEVICE)), (40, 4), (25, 2), (3, 1)],
)
def test_the_forward_shape_is_the_shape_every_forward_ran(tokens: int | None, rows: int) -> None:
    engine = Engine.for_model(LOADED, FP32, tokens_per_forward=tokens, max_rows_per_forward=64)
    shape = engine.forward_shape
    # the rows' own tokens, not the budget: 25 tokens of 10-gene rows run 2 rows, 20 tokens
    assert shape == ForwardShape(rows, rows * GENES)
    seen: list[tuple[int, ...]] = []
    hook = LOADED.model.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape))
    try:
        handles = [engine.submit(job(n)) for n in (1, 5, 7)]
        run_until_idle(engine)
    finally:
        hook.remove()
    for handle in handles:
        handle.future.result(timeout=0)
    assert seen and set(seen) == {torch.Size([shape.rows, GENES])}


def test_one_decision_serves_the_sampler_and_the_engine() -> None:
    rows = forward_rows(LOADED, 40)
    assert rows == block_rows_for(GENES, LOADED.device, 40) == 4
    assert model_sampler(LOADED, FP32, tokens_per_forward=40).block_rows == rows
    assert forward_rows(LOADED) == model_sampler(LOADED, FP32).block_rows


def test_an_engine_without_fixed_blocks_says_so() -> None:
    sampler = Sampler(LOADED.model, LOADED.noise, LOADED.graph, precision=FP32)
    engine = Engine(sampler, ModelLimits(num_genes=GENES, num_perturbations=PERTS))
    assert engine.forward_shape == ForwardShape(None, None)
    sampler.block_rows = 3  # read when asked, never stale
    assert engine.forward_shape == ForwardShape(3, 3 * GENES)
    unknown = Engine(sampler, ModelLimits(num_genes=None))
    assert unknown.forward_shape == ForwardShape(3, None)
