"""A block step's memory, and what happens when it does not fit (issue 31, bug 7).

Every forward runs on whole blocks, so the block's rows set the step's peak memory: on CUDA the
default block is bounded by the free memory, and running out names the setting that lowers it.
"""

from __future__ import annotations

import pytest
import torch
from devices import EMULATED, needs_emulator
from engine_models import GENES, job, run_until_idle, tiny_loaded

from sedd.engine import Engine, ModelLimits
from sedd.engine.forwards import STEP_BYTES_PER_TOKEN, model_sampler, rows_that_fit, step_bytes
from sedd.engine.jobs import BlockOutOfMemoryError
from sedd.precision import PrecisionPolicy

K562_GENES, K562_VOCAB = 8563, 1725


def test_rows_that_fit_follow_free_memory_and_the_vocabulary():
    assert step_bytes(1, K562_GENES, K562_VOCAB) / 2**20 == pytest.approx(253.6, abs=0.1)
    assert rows_that_fit(K562_GENES, K562_VOCAB, 80 << 30) == 258  # an idle H100: 15 by tokens
    assert rows_that_fit(K562_GENES, K562_VOCAB, 2 << 30) == 6
    assert rows_that_fit(K562_GENES, K562_VOCAB, 1 << 20) == 1  # never 0
    # fewer bins, more rows: 0.8 x 2 GiB / (8,563 x 261 x 18 B) = 42.7
    assert rows_that_fit(K562_GENES, 261, 2 << 30) == 42


@pytest.mark.skipif(EMULATED, reason="measures on a meta-backed emulation of its own")
@pytest.mark.slow  # an emulation: its C++ device guard is built first
def test_the_per_token_constant_bounds_a_measured_block_step():
    from sedd.cuda_emulation import emulate_cuda
    from sedd.diffusion.graph import graph_from_config
    from sedd.diffusion.noise import noise_from_config
    from sedd.diffusion.sampling import Sampler, StepBranches, StepRows
    from sedd.models.st3 import SEDDPerturbationTransformer
    from sedd.precision import resolve_precision

    genes, bins = 2000, 1724  # K562's vocabulary: the logits dominate, as at the real shape
    with emulate_cuda(backing="meta"):
        with torch.device("meta"):
            model = SEDDPerturbationTransformer(
                num_genes=genes,
                num_bins=bins,
                hidden_dim=64,
                num_layers=2,
                num_heads=2,
                num_perturbations=3,
            )
        model = model.to("cuda").eval()
        graph = graph_from_config({"type": "absorb", "dim": bins + 1})
        noise = noise_from_config({"type": "loglinear", "eps": 1e-3})
        sampler = Sampler(model, noise, graph, precision=resolve_precision("bf16", "cuda"))
        peaks = []
        for rows in (2, 4):
            x = torch.full((rows, genes), bins, device="cuda")
            labels = torch.zeros(rows, dtype=torch.long, device="cuda")
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            rows = StepRows.of_request(x, 0.8, 0.6, labels=labels)
            sampler._block_step(rows, StepBranches(), True)
            peaks.append(torch.cuda.max_memory_allocated() - base)
    per_row = (peaks[1] - peaks[0]) / 2
    per_token = per_row / (genes * (bins + 1))
    assert 0.4 * STEP_BYTES_PER_TOKEN <= per_token <= STEP_BYTES_PER_TOKEN, per_token


@needs_emulator
def test_the_default_cuda_block_shrinks_to_the_free_memory(monkeypatch: pytest.MonkeyPatch):
    loaded = tiny_loaded()
    loaded.model.to("cuda")
    policy = PrecisionPolicy(device=torch.device("cuda"), amp_dtype=None)
    roomy = model_sampler(loaded, policy).block_rows
    per_row = step_bytes(1, GENES, loaded.graph.dim)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * per_row, 80 << 30))
    assert model_sampler(loaded, policy).block_rows == 8  # 80% of 10 rows' worth
    assert roomy == 102  # 1024 tokens / 10 genes: the lane's CPU-sized default
    assert model_sampler(loaded, policy, tokens_per_forward=200).block_rows == 20  # asked for


@needs_emulator
def test_a_block_set_by_hand_that_does_not_fit_warns_at_start_up_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    loaded = tiny_loaded()
    loaded.model.to("cuda")
    policy = PrecisionPolicy(device=torch.device("cuda"), amp_dtype=None)
    per_row = step_bytes(1, GENES, loaded.graph.dim)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * per_row, 80 << 30))
    with caplog.at_level("WARNING", logger="sedd.engine.forwards"):
        assert model_sampler(loaded, policy, tokens_per_forward=80).block_rows == 8  # fits
        assert not caplog.records
        assert model_sampler(loaded, policy, tokens_per_forward=200).block_rows == 20  # kept
    (record,) = caplog.records
    assert "tokens_per_forward 200: a block step of 20 rows" in record.getMessage()
    assert "(SEDD_TOKENS_PER_FORWARD) to 80," in record.getMessage()  # 8 rows x 10 genes


@needs_emulator
def test_running_out_of_memory_names_the_setting_to_lower(emulator, monkeypatch):
    loaded = tiny_loaded()
    loaded.model.to("cuda")
    policy = PrecisionPolicy(device=torch.device("cuda"), amp_dtype=None)
    sampler = model_sampler(loaded, policy, tokens_per_forward=40)
    engine = Engine(sampler, ModelLimits.of_model(loaded), max_rows_per_forward=8)
    handles = [engine.submit(job(3, steps=3, seed=s)) for s in (1, 2)]
    engine.tick()  # the jobs' tokens are on the device, one step taken
    tight = emulator.allocated[0] + 1_000  # no room for a block step's temporaries
    monkeypatch.setattr(emulator.devices[0], "total_memory", tight)
    run_until_idle(engine)
    for handle in handles:
        with pytest.raises(BlockOutOfMemoryError, match=r"lower --tokens-per-forward \(SEDD"):
            handle.future.result(timeout=0)
        err = handle.future.exception(timeout=0)
        assert (err.tokens_per_forward, err.suggested) == (40, 20)  # 4 rows x 10 genes
