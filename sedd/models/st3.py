"""Score networks: the protocol every model meets, and st3's single-cell transformers.

Network definitions only: no sampling, no checkpoint files, no autocast decisions (those live in
``sedd.diffusion.sampling``, ``sedd.checkpoints`` and ``sedd.precision``).

Score-model protocol
--------------------
Any module the samplers can drive (``ScoreModel``, defined in ``sedd.precision`` and re-exported
here) provides:

* ``parametrisation: Literal["x0", "score"]``: what ``forward`` returns (below).
* ``vocab_size: int``: V, the number of token classes *including* the mask/absorbing token when
  the model has one.
* ``mask_index: int | None``: the absorbing (mask) token, ``None`` for uniform-graph models.
* ``forward(x, sigma, labels=None, cell_types=None) -> Tensor (B, L, V)`` with ``x`` a
  LongTensor (B, L) of tokens and ``sigma`` a FloatTensor (B,) holding the *total* noise
  sigma(t) of each row (rows may differ). ``labels`` / ``cell_types`` are conditioning inputs;
  a model that has none raises ``ValueError`` when they are given.

  - ``"x0"``: logits over the V classes of the clean token at each position. The mask class is
    part of V; the sampler excludes it before drawing.
  - ``"score"``: the log of the SEDD concrete score, log s(x, sigma)_y = log p_t(y) / p_t(x),
    exactly as reference SEDD's model returns it (the entry of the current token is 0).

An x0 output may be bf16 under autocast; the sampler casts it to fp32 at the boundary. The
output is the caller's: the sampler overwrites an x0 output's mask column in place, so a model
returns a fresh tensor, not one it keeps.

Models
------
* ``SEDDTransformer`` / ``SEDDPerturbationTransformer`` (here): st3's x0 networks, with st3's
  exact state-dict layout (vocab = num_bins + 1, mask index = num_bins). The perturbation model
  also covers two relatives by its ``conditioning`` and ``cell_types_required`` arguments:
  aivc-dcm's ``SEDDPerturbationTransformerSeparateFiLM`` (one FiLM per signal, applied in turn,
  same state-dict layout as DCM's) and st3's cell-type family
  ``SEDDCellTypePerturbationTransformer`` (the summed model with cell types required; its
  ``celltype_*`` weights are renamed on loading, ``sedd.checkpoints.st3``).
* ``sedd.models.ddit.DDiT``: reference SEDD's diffusion transformer, score parametrisation. It
  shares ``sinusoidal_embedding``, ``RotaryEmbedding`` and ``rope_attention``
  (``sedd.models.layers``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sedd.models.layers import (
    AdaLayerNorm,
    RotaryEmbedding,
    SeparateFiLMNorm,
    SinusoidalEmbedding,
    check_inputs,
    rope_attention,
    sinusoidal_embedding,
)
from sedd.precision import ScoreModel

__all__ = [
    "AdaLayerNorm",
    "Conditioning",
    "RotaryEmbedding",
    "SEDDPerturbationTransformer",
    "SEDDTransformer",
    "ScoreModel",
    "SeparateFiLMNorm",
    "check_inputs",
    "rope_attention",
    "sinusoidal_embedding",
]

# How the conditioning signals (time, perturbation[, cell type]) enter the adaLN layers:
# "sum": one FiLM of their sum (st3); "separate_film": one FiLM per signal, in turn (aivc-dcm).
Conditioning = Literal["sum", "separate_film"]


# ----------------------------------------------------------------------------------------------
# st3 single-cell transformers (x0 parametrisation)
# ----------------------------------------------------------------------------------------------


def _mlp(dim_in: int, hidden: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, hidden), nn.GELU(), nn.Linear(hidden, dim_out))


class ST3Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)
        self.rotary = RotaryEmbedding(dim // n_heads)  # registered last, as st3 orders its keys

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(rope_attention(self.qkv(x), self.n_heads, self.rotary))  # (B, L, H)


class ST3FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, mult * dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mult * dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


Norm = Callable[[int], nn.Module]  # dim -> an adaLN module taking (x, c)


class ST3Block(nn.Module):
    """Pre-norm block: h = x + attn(adaLN(x, c)); out = h + ff(adaLN(h, c))."""

    def __init__(
        self, dim: int, n_heads: int, ff_mult: int, dropout: float, norm: Norm = AdaLayerNorm
    ) -> None:
        super().__init__()
        self.attn_norm = norm(dim)
        self.attn = ST3Attention(dim, n_heads)
        self.ff_norm = norm(dim)
        self.ff = ST3FeedForward(dim, ff_mult, dropout)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x, c))  # (B, L, H)
        return x + self.ff(self.ff_norm(x, c))


class _ST3Base(nn.Module):
    """Shared trunk: logits = out_proj(adaLN(blocks(token_embed(x) + gene_embed(pos), c), c)).

    ``c = time_embed(sigma)`` (+ conditioning added by subclasses), with
    time_embed = [sinusoidal(H) = [sin(sigma f), cos(sigma f)], f_i = 10000^(-i/(H/2))]
    -> Linear(H, 4H) -> GELU -> Linear(4H, H). ``c`` enters adaLN without an activation; it is
    (B, H) for ``AdaLayerNorm`` and (B, S, H) for ``SeparateFiLMNorm`` (``norm`` picks one).
    GELU is exact (erf) and LayerNorm eps is 1e-5; these and the sin-then-cos order were pinned
    by matching st3's own outputs (tests/models/test_model_parity.py) to ~1e-9.
    """

    parametrisation: Literal["x0", "score"] = "x0"

    def __init__(
        self,
        num_genes: int,
        num_bins: int,
        hidden_dim: int,
        num_layers: int,
        num_heads: int,
        ff_mult: int,
        dropout: float,
        max_seq_len: int | None,
        norm: Norm = AdaLayerNorm,
    ) -> None:
        super().__init__()
        if hidden_dim % num_heads or (hidden_dim // num_heads) % 2:
            raise ValueError(
                f"`hidden_dim` ({hidden_dim}) must split into `num_heads` ({num_heads}) heads of "
                "even size."
            )
        self.num_genes, self.num_bins, self.hidden_dim = num_genes, num_bins, hidden_dim
        self.vocab_size: int = num_bins + 1
        self.mask_index: int | None = num_bins
        self.max_seq_len = min(max_seq_len or num_genes, num_genes)
        self.token_embed = nn.Embedding(self.vocab_size, hidden_dim)
        self.gene_embed = nn.Embedding(num_genes, hidden_dim)
        self.time_embed = nn.Sequential(
            SinusoidalEmbedding(hidden_dim),
            nn.Linear(hidden_dim, 4 * hidden_dim),
            nn.GELU(),
            nn.Linear(4 * hidden_dim, hidden_dim),
        )
        self.blocks = nn.ModuleList(
            ST3Block(hidden_dim, num_heads, ff_mult, dropout, norm) for _ in range(num_layers)
        )
        self.out_norm = norm(hidden_dim)
        self.out_proj = nn.Linear(hidden_dim, self.vocab_size, bias=False)

    def _init_weights(self) -> None:
        """N(0, 0.02) for Linear / Embedding weights, zero biases (st3's init)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def _condition(
        self, sigma: torch.Tensor, labels: torch.Tensor | None, cell_types: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, L) tokens, sigma (B,) total noise -> logits (B, L, V) of the clean token."""
        check_inputs(x, sigma, self.max_seq_len)
        c = self._condition(sigma, labels, cell_types)  # (B, H), or (B, S, H) separate FiLM
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.token_embed(x) + self.gene_embed(pos)[None]  # (B, L, H)
        for block in self.blocks:
            h = block(h, c)
        return self.out_proj(self.out_norm(h, c))  # (B, L, V)

    def score(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """st3's ``score``: log_softmax(logits) over all V classes, mask included (B, L, V)."""
        return F.log_softmax(self(x, sigma, labels=labels, cell_types=cell_types), dim=-1)


class SEDDTransformer(_ST3Base):
    """st3's unconditional model: c = time_embed(sigma).

    ``max_seq_len`` bounds L (default and upper limit: ``num_genes``, one gene embedding a row).
    """

    def __init__(
        self,
        num_genes: int,
        num_bins: int,
        hidden_dim: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        ff_mult: int = 4,
        dropout: float = 0.1,
        max_seq_len: int | None = None,
    ) -> None:
        super().__init__(
            num_genes, num_bins, hidden_dim, num_layers, num_heads, ff_mult, dropout, max_seq_len
        )
        self._init_weights()

    def _condition(
        self, sigma: torch.Tensor, labels: torch.Tensor | None, cell_types: torch.Tensor | None
    ) -> torch.Tensor:
        if labels is not None or cell_types is not None:
            name = "labels" if labels is not None else "cell_types"
            raise ValueError(
                f"`{name}` was given, but SEDDTransformer is unconditional; "
                "use a SEDDPerturbationTransformer checkpoint for conditional generation."
            )
        return self.time_embed(sigma)  # (B, H)


class SEDDPerturbationTransformer(_ST3Base):
    """st3's perturbation model: c = time_embed(sigma) + pert_proj(e) [+ cell_type_proj(ct)].

    e = pert_embed(label) for a LongTensor (B,) of perturbation indices, or
    e = precomputed_proj(v) for a FloatTensor (B, E) of precomputed vectors (e.g. ESM2);
    ct = cell_type_embed(cell type index).

    ``conditioning="separate_film"`` is aivc-dcm's SEDDPerturbationTransformerSeparateFiLM: the
    same three signals are not summed but stacked, c = [time, pert, cell type] (B, S, H), and
    every adaLN applies one FiLM per signal in that order (``SeparateFiLMNorm``).
    ``cell_types_required`` refuses rows without a cell type, as st3's cell-type family
    (SEDDCellTypePerturbationTransformer, the summed model) does; otherwise a missing cell type
    leaves its signal out, as st3 and aivc-dcm do.
    """

    def __init__(
        self,
        num_genes: int,
        num_bins: int,
        num_perturbations: int,
        hidden_dim: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        ff_mult: int = 4,
        dropout: float = 0.1,
        precomputed_emb_dim: int | None = None,
        num_cell_types: int | None = None,
        conditioning: Conditioning = "sum",
        cell_types_required: bool = False,
    ) -> None:
        match conditioning:
            case "sum":
                norm: Norm = AdaLayerNorm
            case "separate_film":
                norm = partial(SeparateFiLMNorm, cell_types=bool(num_cell_types))
            case _:
                raise ValueError(
                    f"`conditioning` must be 'sum' or 'separate_film', got {conditioning!r}."
                )
        if cell_types_required and not num_cell_types:
            raise ValueError("`cell_types_required` needs `num_cell_types` >= 1, got none.")
        super().__init__(
            num_genes, num_bins, hidden_dim, num_layers, num_heads, ff_mult, dropout, None, norm
        )
        self.conditioning: Conditioning = conditioning
        self.cell_types_required = cell_types_required
        self.num_perturbations = num_perturbations
        self.pert_embed = nn.Embedding(num_perturbations, hidden_dim)
        self.precomputed_proj: nn.Linear | None = None
        if precomputed_emb_dim:
            self.precomputed_proj = nn.Linear(precomputed_emb_dim, hidden_dim)
        self.cell_type_embed: nn.Embedding | None = None
        self.cell_type_proj: nn.Sequential | None = None
        if num_cell_types:
            self.cell_type_embed = nn.Embedding(num_cell_types, hidden_dim)
            self.cell_type_proj = _mlp(hidden_dim, 4 * hidden_dim, hidden_dim)
        self.pert_proj = _mlp(hidden_dim, 4 * hidden_dim, hidden_dim)
        self._init_weights()

    def _condition(
        self, sigma: torch.Tensor, labels: torch.Tensor | None, cell_types: torch.Tensor | None
    ) -> torch.Tensor:
        batch = sigma.shape[0]
        if labels is None:
            raise ValueError(
                "`labels` is required by SEDDPerturbationTransformer: pass a LongTensor (B,) of "
                "perturbation indices or a FloatTensor (B, E) of precomputed vectors."
            )
        if labels.shape[0] != batch:
            raise ValueError(f"`labels` must have {batch} rows, got shape {tuple(labels.shape)}.")
        if labels.dim() == 1 and not labels.is_floating_point():
            pert = self.pert_embed(labels)  # (B, H)
        elif labels.dim() == 2 and labels.is_floating_point():
            if self.precomputed_proj is None:
                raise ValueError(
                    f"`labels` is a vector batch of shape {tuple(labels.shape)}, but this model "
                    "has no precomputed_proj; pass perturbation indices (LongTensor (B,))."
                )
            pert = self.precomputed_proj(labels)  # (B, H)
        else:
            raise ValueError(
                "`labels` must be a LongTensor (B,) or a FloatTensor (B, E), got "
                f"{labels.dtype} of shape {tuple(labels.shape)}."
            )
        signals = [self.time_embed(sigma), self.pert_proj(pert)]  # (B, H) each
        if cell_types is None and self.cell_types_required:
            raise ValueError(
                "`cell_types` is required by this model (st3's cell-type family): give every "
                "row a cell type (a LongTensor (B,) of cell-type indices)."
            )
        if cell_types is not None:
            if self.cell_type_embed is None or self.cell_type_proj is None:
                raise ValueError(
                    "`cell_types` was given, but this model has no cell-type embedding; "
                    "leave it out."
                )
            if cell_types.shape != (batch,):
                raise ValueError(
                    f"`cell_types` must have shape ({batch},), got {tuple(cell_types.shape)}."
                )
            signals.append(self.cell_type_proj(self.cell_type_embed(cell_types)))
        match self.conditioning:
            case "sum":
                return sum(signals[1:], start=signals[0])  # (B, H), summed left to right
            case "separate_film":
                return torch.stack(signals, dim=1)  # (B, S, H)
