"""The cached rotary table: the same numbers as building it each call, rebuilt when it must be."""

from __future__ import annotations

import torch

from sedd.layers import RotaryEmbedding


def _fresh(rotary: RotaryEmbedding, q: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(q.shape[-2], dtype=torch.float32)
    freqs = torch.outer(pos, rotary.inv_freq)
    angles = torch.cat([freqs, freqs], dim=-1)
    first, second = q.chunk(2, dim=-1)
    return q * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()


def test_the_cached_table_gives_the_formula_and_follows_length_and_loaded_weights():
    torch.manual_seed(0)
    rotary = RotaryEmbedding(8)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    with torch.inference_mode():
        rq, rk = rotary(q, k)
        assert torch.equal(rq, _fresh(rotary, q)) and torch.equal(rk, _fresh(rotary, k))
        first = rotary._table
        rotary(q, k)
        assert rotary._table is first  # reused, not rebuilt
        longer = torch.randn(1, 3, 9, 8)
        assert torch.equal(rotary(longer, longer)[0], _fresh(rotary, longer))
    rotary.load_state_dict({"inv_freq": rotary.inv_freq * 2})  # new weights: a new table
    with torch.inference_mode():
        assert torch.equal(rotary(q, k)[0], _fresh(rotary, q))
    # a table built under inference mode is never handed to autograd (training after sampling)
    q.requires_grad_(True)
    rotary(q, k)[0].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
