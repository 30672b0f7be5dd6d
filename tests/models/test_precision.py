"""The precision policy (PRECISION.md): each rule pinned by a test."""

from __future__ import annotations

import itertools

import pytest
import torch
from exact_models import ExactModel, potts_distribution
from torch import nn

import sedd.diffusion.sampling
import sedd.precision
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.sampling import StepRows
from sedd.diffusion.st3_samplers import EulerSampler
from sedd.engine import Engine
from sedd.precision import (
    NonFiniteScoreError,
    PrecisionError,
    PrecisionPolicy,
    resolve_precision,
)

JOINT = potts_distribution(5, 3, 2.0)


class NaNRowModel(nn.Module):
    """Returns NaN in chosen rows: under autocast only, or always.

    With ``always`` the bad rows are those whose ``cell_types`` entry is 1, so that they stay bad
    when the policy recomputes just them.
    """

    parametrisation = "x0"

    def __init__(self, bad_rows: list[int], always: bool = False) -> None:
        super().__init__()
        self.inner = ExactModel(JOINT, 5, 3, "x0")
        self.vocab_size, self.mask_index, self.num_genes = 4, 3, 5
        self.bad_rows, self.always = bad_rows, always

    def forward(self, x, sigma, labels=None, cell_types=None):
        out = self.inner(x, sigma).clone()
        if self.always:
            out[cell_types == 1] = torch.nan
        elif torch.is_autocast_enabled("cpu"):
            out[self.bad_rows] = torch.nan
        return out


def test_autocast_covers_the_model_forward_only_and_draws_are_fp64(monkeypatch):
    seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
    real = sedd.diffusion.sampling.sample_categorical

    def spy(probs, uniforms, **options):
        seen.append((torch.is_autocast_enabled("cpu"), probs.dtype, uniforms.dtype))
        return real(probs, uniforms, **options)

    monkeypatch.setattr(sedd.diffusion.sampling, "sample_categorical", spy)
    model = ExactModel(JOINT, 5, 3, "x0")
    sampler = EulerSampler(
        model, LogLinearNoise(), AbsorbingGraph(3), use_amp=True, amp_dtype=torch.bfloat16
    )
    sampler.sample(32, steps=4, seed=0)
    assert model.autocast_seen and all(model.autocast_seen)  # forward under autocast
    assert seen and all(s == (False, torch.float32, torch.float64) for s in seen)


def test_model_output_leaves_autocast_as_fp32():
    model = ExactModel(JOINT, 5, 3, "x0")
    x = torch.full((4, 5), 3)
    policy = resolve_precision("bf16", "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x, torch.ones(4)).dtype == torch.bfloat16  # the raw model output
    out, redone = policy.forward(model, x, torch.ones(4))
    assert out.dtype == torch.float32 and out.shape == (4, 5, 4) and redone == ()
    gathered = policy.forward(model, x, torch.ones(4), positions=x == 3).scores
    assert gathered.dtype == torch.float32 and gathered.shape == (20, 4)


def test_fp32_sampling_never_enters_autocast():
    model = ExactModel(JOINT, 5, 3, "x0")
    EulerSampler(model, LogLinearNoise(), AbsorbingGraph(3), use_amp=False).sample(
        4, steps=2, seed=0
    )
    assert model.autocast_seen and not any(model.autocast_seen)


def test_nan_row_is_recomputed_in_fp32_and_counted():
    sampler = EulerSampler(
        NaNRowModel(bad_rows=[1]), LogLinearNoise(), AbsorbingGraph(3), use_amp=True
    )
    reference = EulerSampler(
        ExactModel(JOINT, 5, 3, "x0"), LogLinearNoise(), AbsorbingGraph(3), use_amp=False
    )
    x = ref = torch.full((4, 5), 3)
    times = torch.tensor([1.0, 0.6, 0.3, 0.0], dtype=torch.float64)
    expected_fallbacks = fallbacks = 0
    for step, (t, s) in enumerate(itertools.pairwise(times)):
        masked = bool((ref[1] == 3).any())  # row 1 is recomputed while it has masks
        expected_fallbacks += int(masked)
        out = sampler.step(StepRows.of_request(x, t, s, step=step))
        assert out.fp32_fallback_rows == ((1,) if masked else ())
        x, fallbacks = out.tokens, fallbacks + len(out.fp32_fallback_rows)
        ref = reference.step(StepRows.of_request(ref, t, s, step=step)).tokens
    assert expected_fallbacks >= 2 and fallbacks == expected_fallbacks
    assert sampler.precision.record(fallbacks)["fp32_fallbacks"] == expected_fallbacks
    assert int(x.max()) < 3 and int(x.min()) >= 0
    # the recomputed row follows the fp32 run exactly
    assert torch.equal(x[1], ref[1])


def test_nan_in_fp32_too_fails_the_request_clearly():
    sampler = EulerSampler(
        NaNRowModel(bad_rows=[2], always=True), LogLinearNoise(), AbsorbingGraph(3), use_amp=True
    )
    with pytest.raises(NonFiniteScoreError, match=r"rows \[2\] even in fp32"):
        sampler.sample(4, steps=2, seed=0, cell_types=torch.tensor([0, 0, 1, 0]))


def test_the_step_and_the_policys_forward_share_one_fp32_fallback(monkeypatch):
    """Rule 5 has one implementation, ``sedd.precision.fp32_fallback``: the sampler's step and
    ``PrecisionPolicy.forward`` (precision reports, benchmarks) both recompute through it."""
    seen: list[tuple[str, list[int]]] = []
    real = sedd.precision.fp32_fallback

    def spy(where):
        def fallback(bad, device, recompute):
            seen.append((where, bad.tolist()))
            return real(bad, device, recompute)

        return fallback

    monkeypatch.setattr(sedd.diffusion.sampling, "fp32_fallback", spy("step"))
    monkeypatch.setattr(sedd.precision, "fp32_fallback", spy("forward"))
    x = torch.full((4, 5), 3)
    step = EulerSampler(NaNRowModel(bad_rows=[1]), LogLinearNoise(), AbsorbingGraph(3))
    assert step.step(StepRows.of_request(x, 1.0, 0.5)).fp32_fallback_rows == (1,)
    policy = resolve_precision("bf16", "cpu")
    fp32 = resolve_precision("fp32", "cpu")
    model, masked = NaNRowModel(bad_rows=[1]), x == 3
    expected = fp32.forward(model, x, torch.ones(4)).scores
    out, redone = policy.forward(model, x, torch.ones(4))  # bf16 rows, row 1 in fp32
    assert redone == (1,) and bool(torch.isfinite(out).all())
    assert torch.equal(out[1], expected[1]) and not torch.equal(out[0], expected[0])
    # in blocks of 2 rows the model spoils row 1 of each block: rows 1 and 3
    gathered = policy.forward(model, x, torch.ones(4), positions=masked, block_rows=2)
    assert gathered.fp32_fallback_rows == (1, 3)
    assert torch.equal(gathered.scores.view(4, 5, 4)[[1, 3]], expected[[1, 3]])
    assert torch.equal(gathered.scores.view(4, 5, 4)[[0, 2]], out[[0, 2]])
    assert seen == [("step", [1]), ("forward", [1]), ("forward", [1, 3])]
    with pytest.raises(NonFiniteScoreError, match=r"rows \[2\] even in fp32"):
        policy.forward(NaNRowModel([], always=True), x, torch.ones(4),
                       cell_types=torch.tensor([0, 0, 1, 0]))  # fmt: skip


def test_fp16_on_cpu_is_refused_with_what_to_use_instead():
    with pytest.raises(PrecisionError, match=r"'fp16' is refused on CPU.*use 'bf16' or 'fp32'"):
        resolve_precision("fp16", "cpu")
    with pytest.raises(PrecisionError, match="fp16"):
        EulerSampler(
            ExactModel(JOINT, 5, 3, "x0"),
            LogLinearNoise(),
            AbsorbingGraph(3),
            use_amp=True,
            amp_dtype=torch.float16,
        )


def test_device_rules_and_auto(monkeypatch):
    monkeypatch.setattr(sedd.precision, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu").amp_dtype == torch.bfloat16
    monkeypatch.setattr(sedd.precision, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu").amp_dtype is None  # emulated bf16 would be slower
    with pytest.warns(UserWarning, match="no native bf16.*use precision 'fp32'"):
        assert resolve_precision("bf16", "cpu").amp_dtype == torch.bfloat16
    assert resolve_precision("fp32", "cpu").amp_dtype is None
    assert resolve_precision("off", "cpu").name == "fp32"
    with pytest.raises(PrecisionError, match="must be one of"):
        resolve_precision("int8", "cpu")
    with pytest.raises(PrecisionError, match="tf32=True only applies to CUDA"):
        resolve_precision("bf16", "cpu", tf32=True)


def test_precision_record_names_everything_rule_8_asks_for():
    record = PrecisionPolicy(device=torch.device("cpu")).record()
    assert record == {
        "amp_dtype": "bf16",
        "weight_dtype": "float32",
        "tf32": False,
        "device": "cpu",
        "torch_version": torch.__version__,
        "fp32_fallbacks": 0,
    }


def test_fp64_draws_reach_rare_categories_at_their_rate():
    # A category of probability 2e-8: fp32 uniforms (2^-24 grid) draw it at ~0.16x its rate.
    n = 4_000_000
    probs = torch.tensor([[1 - 2e-8, 2e-8]]).expand(n, 2)
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    drawn = sedd.diffusion.sampling.sample_categorical(probs, uniforms)
    assert drawn.dtype == torch.long
    with pytest.raises(TypeError, match="float64"):
        sedd.diffusion.sampling.sample_categorical(probs, uniforms.float())
    # The draw is an exact inverse CDF: category 1 exactly when u * total lands in its interval.
    total = probs[0].double().sum()
    expected = (uniforms * total >= probs[0, 0].double()).long()
    assert torch.equal(drawn, expected)


def test_bf16_autocast_on_the_lane_device_covers_the_forward_only(monkeypatch):
    """On the test lane's device (CPU, or CUDA with SEDD_TEST_DEVICE=cuda): the st3 forward runs
    under bf16 autocast, the step's arithmetic outside it in fp32, the draws in fp64."""
    from devices import DEVICE
    from engine_models import LOADED, job, run_until_idle

    seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
    real = sedd.diffusion.sampling.sample_categorical

    def spy(probs, uniforms, **options):
        seen.append((torch.is_autocast_enabled(DEVICE.type), probs.dtype, uniforms.dtype))
        return real(probs, uniforms, **options)

    inside: list[bool] = []
    hook = LOADED.model.register_forward_hook(
        lambda *_: inside.append(torch.is_autocast_enabled(DEVICE.type))
    )
    monkeypatch.setattr(sedd.diffusion.sampling, "sample_categorical", spy)
    try:
        engine = Engine.for_model(LOADED, resolve_precision("bf16", DEVICE))
        handle = engine.submit(job(3, steps=3, seed=2))
        run_until_idle(engine)
    finally:
        hook.remove()
    tokens = handle.future.result(timeout=0).tokens
    assert tokens.shape == (3, LOADED.config.num_genes) and int(tokens.max()) < LOADED.graph.dim - 1
    assert inside and all(inside)
    assert seen and all(s == (False, torch.float32, torch.float64) for s in seen)
