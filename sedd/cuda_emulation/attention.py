"""Which attention kernel a GPU would pick: the emulator records, per SDPA call, whether CUDA's
flash kernel takes its inputs (``Emulator.attention``)."""

from __future__ import annotations

from typing import Any

import torch


def flash_eligibility(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **_: Any,
) -> str:
    """Whether CUDA's flash attention kernel takes these inputs: "flash", else the first reason
    it would not (fp16/bf16 only, head size a multiple of 8 up to 256, no mask, q/k/v alike)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype} (flash needs fp16/bf16)"
    if len({q.dtype, k.dtype, v.dtype}) > 1:
        return "q, k and v differ in dtype"
    head = q.shape[-1]
    if head % 8 or head > 256 or k.shape[-1] != head or v.shape[-1] != head:
        return f"head size {head} (flash needs a multiple of 8, at most 256, alike in q/k/v)"
    if attn_mask is not None:
        return "an attention mask"
    if q.dim() != 4:
        return f"{q.dim()}-d inputs (flash takes (B, heads, L, d))"
    return "flash"
