"""The shared layers' fused element-wise work gives the textbook formulas' numbers: the cached
rotary table and its one-pass q/k rotation, and adaLN's layer norm with gamma and beta folded in."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sedd.models.layers import RotaryEmbedding, rope_attention
from sedd.models.st3 import AdaLayerNorm

# fused multiply-adds round once where the formula rounds twice: a few fp32 ulps apart
ATOL = 2e-6


def _fresh(rotary: RotaryEmbedding, q: torch.Tensor) -> torch.Tensor:
    """q cos + rotate_half(q) sin along q's dim -2, the table built from scratch."""
    pos = torch.arange(q.shape[-2], dtype=torch.float32)
    freqs = torch.outer(pos, rotary.inv_freq)
    angles = torch.cat([freqs, freqs], dim=-1)
    first, second = q.chunk(2, dim=-1)
    return q * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol)


def test_the_cached_table_gives_the_formula_and_follows_length_and_loaded_weights():
    torch.manual_seed(0)
    rotary = RotaryEmbedding(8)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    with torch.inference_mode():
        rq, rk = rotary(q, k)
        _close(rq, _fresh(rotary, q))
        _close(rk, _fresh(rotary, k))
        assert not torch.equal(rq, q)  # position 1.. really rotated
        first = rotary.table(5, q.device, q.dtype)
        rotary(q, k)
        assert rotary.table(5, q.device, q.dtype)[0] is first[0]  # reused, not rebuilt
        longer = torch.randn(1, 3, 9, 8)
        _close(rotary(longer, longer)[0], _fresh(rotary, longer))
    rotary.load_state_dict({"inv_freq": rotary.inv_freq * 2})  # new weights: a new table
    with torch.inference_mode():
        _close(rotary(q, k)[0], _fresh(rotary, q))
        assert (rotary(q, k)[0] - rq).abs().max() > 0.1
    # a table built under inference mode is never handed to autograd (training after sampling)
    q.requires_grad_(True)
    rotary(q, k)[0].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_table_of_another_dtype_keeps_the_first_alive():
    # A CUDA graph captured under bf16 autocast reads the bf16 table on every replay; an fp32
    # recomputation (precision rule 5) builds the fp32 table. Replacing the one cached table
    # freed the bf16 one while the graph still read it (silent wrong cells on a GPU).
    rotary = RotaryEmbedding(8)
    with torch.inference_mode():
        bf16 = rotary.table(6, torch.device("cpu"), torch.bfloat16)
        fp32 = rotary.table(6, torch.device("cpu"), torch.float32)
        assert rotary.table(6, torch.device("cpu"), torch.bfloat16)[0] is bf16[0]
        assert rotary.table(6, torch.device("cpu"), torch.float32)[1] is fp32[1]
    assert bf16[0].dtype == torch.bfloat16 and fp32[0].dtype == torch.float32


def test_rope_attention_rotates_q_and_k_in_place_of_the_per_head_layout():
    torch.manual_seed(1)
    b, length, heads, d = 2, 7, 3, 4
    rotary = RotaryEmbedding(d)
    qkv = torch.randn(b, length, 3 * heads * d)
    q, k, v = qkv.view(b, length, 3, heads, d).permute(2, 0, 3, 1, 4)  # (B, h, L, d)
    expected = F.scaled_dot_product_attention(_fresh(rotary, q), _fresh(rotary, k), v)
    expected = expected.transpose(1, 2).reshape(b, length, heads * d)
    _close(rope_attention(qkv, heads, rotary), expected)


@pytest.mark.parametrize("rows", [1, 3])
def test_adaptive_layer_norm_is_gamma_times_the_norm_plus_beta(rows: int) -> None:
    torch.manual_seed(2)
    norm = AdaLayerNorm(16)
    x, c = torch.randn(rows, 5, 16) * 3 + 1, torch.randn(rows, 16)
    gamma, beta = norm.gamma_beta(c)[:, None].chunk(2, dim=-1)
    expected = gamma * F.layer_norm(x, (16,)) + beta
    with torch.no_grad():
        _close(norm(x, c), expected)
        # under bf16 autocast gamma and beta come out of the linear in bf16; the product stays
        # in the residual stream's fp32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = norm(x, c)
            g16, b16 = norm.gamma_beta(c)[:, None].chunk(2, dim=-1)
        assert g16.dtype == torch.bfloat16 and out.dtype == torch.float32
        _close(out, g16.float() * F.layer_norm(x, (16,)) + b16.float())
