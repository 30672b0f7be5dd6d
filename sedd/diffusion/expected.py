"""Expected counts: per gene, the mean of the distribution its count was drawn from.

A sampled count is one draw; the distribution it was drawn from is known at the step that drew
it. Under the absorbing graph a gene is drawn once, at the step where it leaves the mask, from
the step's jump weights normalised over the real tokens (the counts): p(x_0 = k | it leaves the
mask now, the cell so far), after temperature (``categorical.temper``). Its mean,
sum_k p_k * k, is the gene's expected count given everything drawn before it: a
Rao-Blackwellised estimate of the count, unbiased for the same conditional mean as the draw
itself and never of larger variance (scvi-tools' decoder mean plays that part). Averaged over
draws of a cell it estimates the model's conditional mean of each gene given the observed ones
with less noise than the mean of the draws.

The step computes it only for rows that carry ``StepRows.expected`` (a (B, L) float32 state per
row) and keeps it with ``torch.where`` where a gene commits: no host sync, no shape that depends on
the data, and nothing at all for rows without it. Observed (fixed) genes never move, so they keep
the count they started with. Token k is count k (``sedd.io.tokens``); the mask is never a count.
"""

from __future__ import annotations

import torch

from sedd.diffusion.graph import Graph


def check_expected(expected: object, graph: Graph, denoise: str = "sample") -> None:
    """Refuse ``expected`` unless it is a bool the model and sampler can provide: the absorbing
    graph (a gene drawn once, from one distribution) and a final denoise that draws (an argmax
    denoise draws nothing)."""
    if not isinstance(expected, bool):
        raise ValueError(f"`expected` must be True or False, got {expected!r}.")
    if expected and not graph.absorb:
        raise ValueError(
            "`expected` True needs a model on the absorbing (masked) graph, where each gene is "
            "drawn once; this model's graph is uniform: leave `expected` off."
        )
    if expected and denoise != "sample":
        raise ValueError(
            f"`expected` True needs a sampler whose final denoise draws, got denoise "
            f"{denoise!r}: build the Sampler with denoise='sample'."
        )


def commit_expected(
    previous: torch.Tensor,
    probs: torch.Tensor,
    tokens: torch.Tensor,
    changing: torch.Tensor,
    mask: int,
) -> torch.Tensor:
    """(b, L) float32: ``previous``, with the mean count of ``probs`` where a gene committed.

    ``probs`` (b, L, V) are the step's jump weights as drawn from (unnormalised, >= 0, the mask's
    column 0), ``tokens`` (b, L) the step's result, ``changing`` (b, L) the positions it drew
    at: a gene commits where it drew a real token.
    """
    # precision: fp32, outside autocast, as the step's other arithmetic (docs/precision.md rule
    # 3); the sums run over V categories (relative error ~log2(V) * 2^-24), and the layer they
    # feed is float32. The mask's weight is 0, so its value never counts.
    counts = torch.arange(probs.shape[-1], dtype=probs.dtype, device=probs.device)  # (V,)
    total = probs.sum(dim=-1).clamp_min(torch.finfo(probs.dtype).tiny)  # (b, L)
    means = (probs * counts).sum(dim=-1) / total  # (b, L): sum_k p_k k / sum_k p_k
    committed = changing & (tokens != mask)
    return torch.where(committed, means, previous)
