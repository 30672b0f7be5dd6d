"""Drawing one category per position: the fp64 inverse-CDF draw, and temperature.

The sampler (``sedd.diffusion.sampling``) turns a step into unnormalised transition probabilities;
this is how a category is drawn from them (docs/precision.md rule 4: the CDF is accumulated in fp64
and the uniforms are fp64, so rare categories keep their rate).
"""

from __future__ import annotations

import math

import torch


def sample_categorical(
    probs: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    nonnegative: bool = False,
    stay: torch.Tensor | None = None,
    sums: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverse-CDF draw of one category per row of ``probs`` (M, V) from fp64 ``uniforms`` (M,).

    Probabilities need not be normalised; negatives count as 0 (``nonnegative=True``: the caller
    guarantees there are none, and a full pass over ``probs`` is saved). The CDF is accumulated
    in fp64, so a category of probability 1e-9 is drawn at its rate (fp32 draws lose it). A
    zero-probability category is never returned.

    ``stay`` (M,) gives the last category's probability apart (the absorbing step's "stay
    masked"), with ``probs[:, -1]`` 0: the same draw as with it in that column, without a
    (M, V) write for one column. ``sums``: ``chunk_sums(probs)``, where the caller has them
    already (``nonnegative`` rows only).

    The CDF is searched in two levels, so no (M, V) fp64 tensor is written: the chunk holding
    the target is found from the fp64 running total of the chunks' sums (``chunk_sums``: one
    read of ``probs``), then only that chunk's (M, ~sqrt(V)) fp64 CDF is accumulated and
    searched, with the target rescaled from the chunk's sum to that CDF's total. Each category
    is drawn at its rate up to the chunk sum's fp32 rounding (relative, ~sqrt(V) * 2^-24 at
    most), however small the rate: rounding scales a chunk's categories together, it never
    swamps a small one. At the K562 shape the draw moves ~0.9 GB a block step, where a full fp64
    CDF moved 6.2 GB.
    """
    if uniforms.dtype != torch.float64:
        raise TypeError(
            f"uniforms must be float64 (docs/precision.md rule 4), got {uniforms.dtype}."
        )
    weights = probs if nonnegative else probs.clamp_min(0)
    size = weights.shape[1]
    width = chunk_width(size)
    chunk_total = (chunk_sums(weights) if sums is None else sums).double()  # (M, C)
    running = chunk_total.cumsum(dim=-1)  # (M, C): the CDF at each chunk's end
    total = running[:, -1:]
    if stay is not None:
        # the CDF's last entry is the sum before the last category (its column adds 0): the
        # total is that plus the stay, as with the stay in that column
        total = total + (stay if nonnegative else stay.clamp_min(0))[:, None].double()
    target = torch.minimum(
        uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total))
    )  # (M, 1), below the total
    chunk = torch.searchsorted(running, target, right=True)  # (M, 1): first end above target
    past = chunk >= running.shape[1]  # beyond every category: the stay (the last category)
    chunk = chunk.clamp_max(running.shape[1] - 1)
    share = (target - (running.gather(1, chunk) - chunk_total.gather(1, chunk))).div_(
        chunk_total.gather(1, chunk)
    )  # (M, 1): where the target falls in its chunk, from 0 to 1
    columns = chunk * width + torch.arange(width, device=weights.device)  # (M, width)
    inside = columns < size
    local = weights.gather(1, columns.clamp_max(size - 1)).double().masked_fill_(~inside, 0.0)
    cdf = local.cumsum_(dim=-1)
    offset = torch.searchsorted(cdf, share * cdf[:, -1:], right=True)  # (M, 1)
    # rounding can put the target at or past the chunk's total: its last category with weight
    # (the chunk has one, as its sum is above 0)
    steps = torch.diff(cdf, dim=-1, prepend=torch.zeros_like(cdf[:, :1]))
    last = width - 1 - (steps > 0).flip(-1).int().argmax(dim=-1, keepdim=True)
    drawn = chunk * width + torch.where(offset >= width, last, offset)
    return torch.where(past, size - 1, drawn).squeeze(-1).clamp_max(size - 1)


def chunk_width(size: int) -> int:
    """Categories per chunk of a two-level draw over ``size``: ceil(sqrt(size))."""
    return max(1, math.isqrt(size - 1) + 1)


def chunk_sums(weights: torch.Tensor) -> torch.Tensor:
    """(M, C) sums of ``weights`` (M, V) over consecutive ``chunk_width(V)`` columns, the last
    chunk holding what is left: one read of ``weights``, in its dtype, no copy of it. Their
    total is the sum of the row (the absorbing step's jumps moved, from the same pass)."""
    rows, size = weights.shape
    width = chunk_width(size)
    whole = size // width * width
    parts = []
    if whole:
        parts.append(weights[:, :whole].reshape(rows, -1, width).sum(dim=-1))
    if whole < size:
        parts.append(weights[:, whole:].sum(dim=-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def temper(probs: torch.Tensor, current: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Raise the jump probabilities (all but the current token's) to 1/T, keeping their total.

    For an x0 model this is softmax(logits / T) over the candidates; the chance of moving at all
    (e.g. of unmasking) is unchanged, so temperature alters what is drawn, not when. ``probs``
    (..., V), ``current`` (...), ``temperature`` in probs' dtype, broadcasting against (..., 1).
    Each step after the first writes into the tensor before it: one (..., V) temporary at a time.
    """
    here = current[..., None]
    jump = probs.clamp_min(0).scatter_(-1, here, 0.0)  # (..., V)
    mass = jump.sum(dim=-1, keepdim=True)
    never = jump <= 0  # (..., V) bool
    log_jump = jump.clamp_min_(torch.finfo(jump.dtype).tiny).log_().div_(temperature)
    tempered = torch.softmax(log_jump.masked_fill_(never, -torch.inf), dim=-1)
    tempered = tempered.nan_to_num_(nan=0.0).mul_(mass)
    stay = probs.gather(-1, here).clamp_min(0)
    return tempered.scatter_(-1, here, stay)
