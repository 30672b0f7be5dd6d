"""Drawing one category per position: the fp64 inverse-CDF draw, and temperature.

The sampler (``sedd.diffusion.sampling``) turns a step into unnormalised transition probabilities;
this is how a category is drawn from them (docs/precision.md rule 4: the CDF is accumulated in fp64
and the uniforms are fp64, so rare categories keep their rate).
"""

from __future__ import annotations

import torch


def sample_categorical(
    probs: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    nonnegative: bool = False,
    stay: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inverse-CDF draw of one category per row of ``probs`` (M, V) from fp64 ``uniforms`` (M,).

    Probabilities need not be normalised; negatives count as 0 (``nonnegative=True``: the caller
    guarantees there are none, and a full pass over ``probs`` is saved). The CDF is accumulated
    in fp64, so a category of probability 1e-9 is drawn at its rate (fp32 draws lose it). A
    zero-probability category is never returned.

    ``stay`` (M,) gives the last category's probability apart (the absorbing step's "stay
    masked"), with ``probs[:, -1]`` 0: the same draw as with it in that column, without a
    (M, V) write for one column.
    """
    if uniforms.dtype != torch.float64:
        raise TypeError(
            f"uniforms must be float64 (docs/precision.md rule 4), got {uniforms.dtype}."
        )
    weights = probs if nonnegative else probs.clamp_min(0)
    cdf = torch.empty_like(weights, dtype=torch.float64).copy_(weights)  # never `probs` itself
    cdf.cumsum_(dim=-1)  # (M, V), in place: no second fp64 buffer
    total = cdf[:, -1:]
    if stay is not None:
        # cdf[:, -1] is the sum before the last category (its column adds 0): the total is
        # that plus the stay, as the CDF's last entry would be. No entry is above the total,
        # so the search finds the same category (past the last entry: the last category).
        total = total + (stay if nonnegative else stay.clamp_min(0))[:, None].double()
    target = torch.minimum(
        uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total))
    )
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


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
