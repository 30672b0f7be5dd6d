"""Layers the score networks share: input checks, sinusoidal time embeddings, RoPE attention, and
st3's conditioning norms (adaLN, and DCM's separate FiLM).

``sedd.models.st3`` (st3's transformers) and ``sedd.models.ddit`` (reference SEDD's DDiT) both build
on them.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RotaryEmbedding",
    "SinusoidalEmbedding",
    "check_inputs",
    "rope_attention",
    "sinusoidal_embedding",
]


def check_inputs(x: torch.Tensor, sigma: torch.Tensor, max_len: int | None = None) -> None:
    """Raise ``ValueError`` unless x is (B, L), sigma is (B,) and L <= ``max_len``."""
    if x.dim() != 2:
        raise ValueError(f"`x` must be a (B, L) token tensor, got shape {tuple(x.shape)}.")
    if sigma.shape != (x.shape[0],):
        raise ValueError(
            f"`sigma` must have shape (B,) = ({x.shape[0]},), got {tuple(sigma.shape)}; "
            "pass one total-noise value per row."
        )
    if max_len is not None and x.shape[1] > max_len:
        raise ValueError(f"sequence length {x.shape[1]} exceeds the model's maximum {max_len}.")


def sinusoidal_embedding(
    sigma: torch.Tensor, dim: int, order: Literal["sin_cos", "cos_sin"], max_period: float = 1e4
) -> torch.Tensor:
    """(B,) -> (B, dim) features: f_i = max_period^(-i / half), i < half = dim // 2.

    ``"sin_cos"`` gives [sin(sigma f), cos(sigma f)] (st3); ``"cos_sin"`` gives
    [cos(sigma f), sin(sigma f)] (reference SEDD / DiT). An odd ``dim`` is zero-padded.
    """
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half
    )  # (half,)
    args = sigma.float()[:, None] * freqs[None]  # (B, half)
    parts = [args.sin(), args.cos()] if order == "sin_cos" else [args.cos(), args.sin()]
    emb = torch.cat(parts, dim=-1)  # (B, 2 * half)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


class SinusoidalEmbedding(nn.Module):
    """Parameter-free ``sinusoidal_embedding(sigma, dim, "sin_cos")`` (st3's ``time_embed.0``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        return sinusoidal_embedding(sigma, self.dim, "sin_cos")  # (B, dim)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE: q' = q cos(p w) + rotate_half(q) sin(p w), w_j = base^(-2j / d).

    ``inv_freq`` (d/2,) is a persistent buffer, as both st3 and reference SEDD store it.
    rotate_half([a, b]) = [-b, a] on the two halves of the head dimension. The cos/sin tables are
    built once per (length, device, dtype) and kept, one per key (not in the state dict): a CUDA
    graph captured with one of them reads it on every replay, so building another (the bf16
    graph, then an fp32 recomputation) must not free the first. Loading new ``inv_freq`` values
    drops them all. The sin table is kept with its first half negated, so that
    rotate_half(t) sin = [b, a] sin_signed: the rotation is one swap and one multiply-add.
    """

    def __init__(self, head_dim: int, base: float = 10_000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}.")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq)
        self._freq_key: tuple | None = None  # the inv_freq the tables were built from
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def table(
        self, seq_len: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed) of shape (L, d) for positions 0..L-1, cached per (L, device, dtype);
        sin_signed is [-sin, sin] on the two halves."""
        freq = self.inv_freq
        freq_key = (freq.data_ptr(), freq._version, freq.device)
        if freq_key != self._freq_key:  # new inv_freq values (a load): every table is stale
            self._tables, self._freq_key = {}, freq_key
        key = (seq_len, torch.device(device), dtype, torch.is_inference_mode_enabled())
        if key not in self._tables:
            pos = torch.arange(seq_len, device=device, dtype=freq.dtype)
            freqs = torch.outer(pos, freq)  # (L, d/2)
            cos, sin = freqs.cos(), freqs.sin()
            cos = torch.cat([cos, cos], dim=-1)  # (L, d)
            sin_signed = torch.cat([-sin, sin], dim=-1)  # (L, d)
            self._tables[key] = (cos.to(dtype), sin_signed.to(dtype))
        return self._tables[key]

    def rotate(self, t: torch.Tensor, seq_dim: int = -2) -> torch.Tensor:
        """Rotate t (..., L, ..., d) by its position along ``seq_dim``; d is the last dim.

        t cos + rotate_half(t) sin, written as addcmul(t cos, [b, a], sin_signed): three
        element-wise kernels instead of six.
        """
        seq_dim %= t.dim()
        length, head_dim = t.shape[seq_dim], t.shape[-1]
        cos, sin = self.table(length, t.device, t.dtype)
        shape = (length, *([1] * (t.dim() - seq_dim - 2)), head_dim)  # broadcasts against t
        first, second = t.chunk(2, dim=-1)
        swapped = torch.cat([second, first], dim=-1)
        return torch.addcmul(t * cos.view(shape), swapped, sin.view(shape))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q, k of shape (B, heads, L, d) by their position along L."""
        return self.rotate(q), self.rotate(k)


def rope_attention(qkv: torch.Tensor, n_heads: int, rotary: RotaryEmbedding) -> torch.Tensor:
    """Non-causal multi-head SDPA with RoPE on q, k: (B, L, 3H) -> (B, L, H)."""
    b, length, three_h = qkv.shape
    head_dim = three_h // (3 * n_heads)
    qkv = qkv.view(b, length, 3, n_heads, head_dim)
    qk = rotary.rotate(qkv[:, :, :2], seq_dim=1)  # q and k in one pass: (B, L, 2, h, d)
    q, k = qk.permute(2, 0, 3, 1, 4)  # (B, h, L, d) each
    v = qkv[:, :, 2].transpose(1, 2)  # (B, h, L, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # (B, h, L, d)
    return out.transpose(1, 2).reshape(b, length, n_heads * head_dim)


class AdaLayerNorm(nn.Module):
    """adaLN: ``gamma * LayerNorm(x) + beta`` (no affine, no 1 + gamma), [gamma|beta] = W c + b."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma_beta = nn.Linear(dim, 2 * dim)
        self.dim = dim

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        # gamma, beta may be bf16 under autocast; the product is taken in x's dtype (fp32 for the
        # residual stream), as gamma * layer_norm(x) + beta promotes it
        gamma, beta = self.gamma_beta(c).to(x.dtype).chunk(2, dim=-1)  # (B, H) each
        if x.shape[0] == 1:
            # one row (the CPU's forward block): layer norm's own affine applies gamma and beta
            # in the same kernel
            return F.layer_norm(x, (self.dim,), gamma[0], beta[0])  # (1, L, H)
        return torch.addcmul(beta[:, None], gamma[:, None], F.layer_norm(x, (self.dim,)))


class SeparateFiLMNorm(nn.Module):
    """aivc-dcm's separate-FiLM adaLN: h = LayerNorm(x) (no affine), then for each signal s in
    turn (time, perturbation, cell type when given): [gamma_s|beta_s] = W_s c_s + b_s and
    h = gamma_s * h + beta_s.

    ``c`` is (B, S, H): the S signals stacked in that order (S = 2 without a cell type).
    """

    def __init__(self, dim: int, cell_types: bool) -> None:
        super().__init__()
        self.dim = dim
        self.time_gamma_beta = nn.Linear(dim, 2 * dim)
        self.pert_gamma_beta = nn.Linear(dim, 2 * dim)
        self.cell_type_gamma_beta: nn.Linear | None = None
        if cell_types:
            self.cell_type_gamma_beta = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        films = [self.time_gamma_beta, self.pert_gamma_beta, self.cell_type_gamma_beta]
        h = F.layer_norm(x, (self.dim,))  # (B, L, H)
        for film, signal in zip(films[: c.shape[1]], c.unbind(1), strict=True):
            if film is None:
                raise ValueError("a cell-type signal was given to a norm without cell types.")
            # as in AdaLayerNorm: the product is taken in x's dtype (fp32 for the residual stream)
            gamma, beta = film(signal).to(x.dtype).chunk(2, dim=-1)  # (B, H) each
            h = torch.addcmul(beta[:, None], gamma[:, None], h)
        return h
