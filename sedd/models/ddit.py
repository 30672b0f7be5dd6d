"""Reference SEDD's DDiT (louaaron/Score-Entropy-Discrete-Diffusion, ``model/transformer.py``).

A score-parametrised network (see the protocol in ``sedd.models.st3``): ``forward`` returns the log
concrete score with the reference's exact state-dict layout (``vocab_embed.embedding``,
``sigma_map.mlp.{0,2}``, ``rotary_emb.inv_freq``, ``blocks.i.*``, ``output_layer.*``).

Differences from the reference that do not change its fp32 output:
* attention is ``torch.nn.functional.scaled_dot_product_attention`` (never flash-attn), so the
  model runs on CPU;
* the model makes no autocast decision of its own (the reference wraps its blocks in CUDA bf16
  autocast); ``sedd.precision`` decides. The fp32 islands are marked ``# precision:``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from sedd.models.layers import RotaryEmbedding, check_inputs, rope_attention, sinusoidal_embedding
from sedd.precision import fp32_region

__all__ = ["DDiT"]


class RefLayerNorm(nn.Module):
    """The reference's LayerNorm: ``weight * LayerNorm(x)`` (no bias), normalised in fp32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # precision: the reference normalises in fp32 with autocast off; the result stays fp32.
        with fp32_region(x.device.type):
            x = F.layer_norm(x.float(), (self.dim,))
        return x * self.weight


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """sigma (B,) -> mlp([cos(sigma f), sin(sigma f)]) (B, cond), f_i = 10000^(-i/128).

    mlp = Linear(256, cond) -> SiLU -> Linear(cond, cond) (``sigma_map.mlp.{0,2}``).
    """

    def __init__(self, cond_dim: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(
            nn.Linear(frequency_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim)
        )

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoidal_embedding(sigma, self.frequency_dim, "cos_sin"))


class EmbeddingLayer(nn.Module):
    """Token embedding stored as a bare (V, H) parameter ``embedding``."""

    def __init__(self, dim: int, vocab_size: int) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding[x]  # (B, L, H)


class DDiTBlock(nn.Module):
    """adaLN-Zero block: x + g1 * attn(mod(norm1 x)), then + g2 * mlp(mod(norm2 x)).

    [shift1, scale1, g1, shift2, scale2, g2] = adaLN_modulation(c); mod(y) = y (1 + scale) + shift.
    """

    def __init__(
        self, dim: int, n_heads: int, cond_dim: int, dropout: float, mlp_ratio: int = 4
    ) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.norm1 = RefLayerNorm(dim)
        self.attn_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.attn_out = nn.Linear(dim, dim, bias=False)
        self.norm2 = RefLayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(mlp_ratio * dim, dim),
        )
        self.adaLN_modulation = nn.Linear(cond_dim, 6 * dim)
        nn.init.zeros_(self.adaLN_modulation.weight)
        nn.init.zeros_(self.adaLN_modulation.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, rotary: RotaryEmbedding) -> torch.Tensor:
        mods = self.adaLN_modulation(c)[:, None].chunk(6, dim=-1)  # 6 x (B, 1, H)
        shift1, scale1, gate1, shift2, scale2, gate2 = mods
        qkv = self.attn_qkv(_modulate(self.norm1(x), shift1, scale1))  # (B, L, 3H)
        h = self.attn_out(rope_attention(qkv, self.n_heads, rotary))  # (B, L, H)
        x = x + gate1 * F.dropout(h, self.dropout, self.training)
        h = self.mlp(_modulate(self.norm2(x), shift2, scale2))  # (B, L, H)
        return x + gate2 * F.dropout(h, self.dropout, self.training)


class DDitFinalLayer(nn.Module):
    """linear(mod(norm_final x)), [shift, scale] = adaLN_modulation(c); zero-initialised."""

    def __init__(self, dim: int, out_dim: int, cond_dim: int) -> None:
        super().__init__()
        self.norm_final = RefLayerNorm(dim)
        self.linear = nn.Linear(dim, out_dim)
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * dim)
        for layer in (self.linear, self.adaLN_modulation):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=-1)  # (B, 1, H) each
        return self.linear(_modulate(self.norm_final(x), shift, scale))  # (B, L, V)


class DDiT(nn.Module):
    """Reference SEDD's DDiT; ``forward`` returns the log concrete score (B, L, V).

    c = SiLU(sigma_map(sigma)); out = output_layer(blocks(vocab_embed(x), c), c). For the
    absorbing graph with ``scale_by_sigma``: out -= log(e^sigma - 1) + log(V - 1), with
    log(e^sigma - 1) computed as log(expm1(sigma)) for sigma < 0.5. Finally out[..., x] = 0.
    """

    parametrisation: Literal["x0", "score"] = "score"

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        cond_dim: int,
        n_blocks: int,
        n_heads: int,
        length: int,
        graph: Literal["absorb", "uniform"],
        scale_by_sigma: bool = True,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if graph not in ("absorb", "uniform"):
            raise ValueError(f"`graph` must be 'absorb' or 'uniform', got {graph!r}.")
        if scale_by_sigma and graph != "absorb":
            raise ValueError("`scale_by_sigma=True` is only defined for graph='absorb'.")
        if hidden_size % n_heads or (hidden_size // n_heads) % 2:
            raise ValueError(
                f"`hidden_size` ({hidden_size}) must split into `n_heads` ({n_heads}) heads of "
                "even size."
            )
        self.vocab_size: int = vocab_size
        self.mask_index: int | None = vocab_size - 1 if graph == "absorb" else None
        self.graph, self.length, self.scale_by_sigma = graph, length, scale_by_sigma
        self.vocab_embed = EmbeddingLayer(hidden_size, vocab_size)
        self.sigma_map = TimestepEmbedder(cond_dim)
        self.rotary_emb = RotaryEmbedding(hidden_size // n_heads)
        self.blocks = nn.ModuleList(
            DDiTBlock(hidden_size, n_heads, cond_dim, dropout) for _ in range(n_blocks)
        )
        self.output_layer = DDitFinalLayer(hidden_size, vocab_size, cond_dim)

    @classmethod
    def from_reference_config(cls, cfg: Mapping[str, Any]) -> DDiT:
        """Build from the reference's config dict (``tokens``, ``graph.type``, ``model.*``)."""
        try:
            graph, model = cfg["graph"]["type"], cfg["model"]
            tokens = int(cfg["tokens"])
            dims = {k: int(model[k]) for k in ("hidden_size", "cond_dim", "n_blocks", "n_heads")}
            length = int(model["length"])
        except KeyError as err:
            raise ValueError(f"reference SEDD config is missing key {err}.") from None
        return cls(
            vocab_size=tokens + (1 if graph == "absorb" else 0),
            length=length,
            graph=graph,
            scale_by_sigma=bool(model.get("scale_by_sigma", graph == "absorb")),
            dropout=float(model.get("dropout", 0.1)),
            **dims,
        )

    def forward(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, L) tokens, sigma (B,) total noise -> log score (B, L, V), fp32."""
        if labels is not None or cell_types is not None:
            raise ValueError("DDiT is unconditional: `labels` and `cell_types` must be None.")
        check_inputs(x, sigma)
        h = self.vocab_embed(x)  # (B, L, H)
        c = F.silu(self.sigma_map(sigma))  # (B, cond)
        for block in self.blocks:
            h = block(h, c, self.rotary_emb)
        # precision: the sigma scaling and the scatter run in fp32 even under autocast.
        out = self.output_layer(h, c).float()  # (B, L, V)
        with fp32_region(x.device.type):
            if self.scale_by_sigma:
                sigma = sigma.float()
                esigm1 = torch.where(sigma < 0.5, torch.expm1(sigma), sigma.exp() - 1)  # (B,)
                out = out - esigm1.log()[:, None, None] - math.log(self.vocab_size - 1)
            out = torch.scatter(out, -1, x[..., None], torch.zeros_like(out[..., :1]))
        return out
