"""The masked-diffusion training objective of x0 (clean-token) models, and its held-out value.

Objective. Per cell draw t ~ U(t_eps, 1), sigma = sigma(t), and mask each gene independently with
probability 1 - e^{-sigma} (= (1 - eps) t for the log-linear schedule) through the absorbing
graph (``noise_batch``). The model sees the masked tokens, sigma and the label, and predicts the
clean token at every position (``forward_logits``); the mask class is excluded from its softmax,
as in the sampler. ``loss_terms`` gives both objectives from the logits:

* ``"elbo"``: the continuous-time ELBO of masked diffusion (Sahoo et al. 2024, Shi et al. 2024),
  -log p(x) <= E_t [ w(t) sum_{masked l} -log p(x0_l | x_t) ], w(t) = sigma'(t) / (e^sigma - 1),
  which is exactly 1/t for the log-linear schedule. Divided by the number of genes, so the loss
  reads in nats per gene.
* ``"masked_ce"``: st3's objective, the unweighted mean cross-entropy over masked positions.

Precision: logits are cast ``.float()`` and the loss runs in fp32, whatever autocast produced.
``heldout_loss`` measures both objectives on held-out cells with its own seeded generator, so
repeated measurements during a run are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import Noise
from sedd.models.st3 import SEDDPerturbationTransformer, SEDDTransformer, check_inputs
from sedd.precision import PrecisionPolicy

__all__ = [
    "LossTerms",
    "elbo_weight",
    "forward_logits",
    "heldout_loss",
    "loss_terms",
    "noise_batch",
]


def elbo_weight(noise: Noise, t: torch.Tensor) -> torch.Tensor:
    """w(t) = sigma'(t) / (e^sigma(t) - 1), in fp64 then cast to t's dtype; log-linear: 1/t."""
    t64 = t.double()
    return (noise.rate_noise(t64) / torch.expm1(noise.total_noise(t64))).to(t.dtype)


def noise_batch(
    x0: torch.Tensor,
    noise: Noise,
    graph: AbsorbingGraph,
    generator: torch.Generator,
    t_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x0 (B, L) -> (x_t (B, L), t (B,), sigma (B,)) with t ~ U(t_eps, 1) per cell."""
    u = torch.rand(x0.shape[0], generator=generator, device=x0.device)
    t = t_eps + (1 - t_eps) * u  # (B,)
    sigma = noise.total_noise(t)
    return graph.sample_transition(x0, sigma[:, None], generator), t, sigma


def forward_logits(
    model: nn.Module,
    x: torch.Tensor,
    sigma: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    checkpoint_blocks: bool = False,
) -> torch.Tensor:
    """``model(x, sigma, labels)`` for st3 models, optionally checkpointing each block.

    The same computation as ``_ST3Base.forward``, written out so that each block can run under
    ``torch.utils.checkpoint`` (recomputed in backward). Checkpointing applies only in training
    mode with grad enabled. Returns logits (B, L, V).
    """
    if not isinstance(model, SEDDTransformer | SEDDPerturbationTransformer):
        raise ValueError(f"training supports st3 models only, got {type(model).__name__}.")
    check_inputs(x, sigma, model.max_seq_len)
    c = model._condition(sigma, labels, None)  # (B, H)
    pos = torch.arange(x.shape[1], device=x.device)
    h = model.token_embed(x) + model.gene_embed(pos)[None]  # (B, L, H)
    recompute = checkpoint_blocks and model.training and torch.is_grad_enabled()
    for block in model.blocks:
        h = checkpoint(block, h, c, use_reentrant=False) if recompute else block(h, c)
    return model.out_proj(model.out_norm(h, c))  # (B, L, V)


@dataclass
class LossTerms:
    """Per-batch pieces of both objectives (fp32)."""

    elbo: torch.Tensor  # (B,) per cell: w(t) * sum_masked -log p / num_genes  (nats/gene)
    nll_sum: torch.Tensor  # () sum of -log p over masked positions
    n_masked: int

    def loss(self, objective: str) -> torch.Tensor:
        match objective:
            case "elbo":
                return self.elbo.mean()
            case "masked_ce":
                return self.nll_sum / max(self.n_masked, 1)
            case _:
                raise ValueError(f"objective must be 'elbo' or 'masked_ce', got {objective!r}.")


def loss_terms(
    logits: torch.Tensor,
    x0: torch.Tensor,
    xt: torch.Tensor,
    t: torch.Tensor,
    noise: Noise,
    mask_index: int,
) -> LossTerms:
    """Both objectives from logits (B, L, V) of the clean tokens x0 (B, L) given x_t (B, L)."""
    logits = logits.float()  # precision: the loss runs in fp32, whatever autocast produced
    masked = xt == mask_index  # (B, L)
    rows = masked.nonzero()[:, 0]  # (M,) cell of each masked position
    log_p = F.log_softmax(logits[masked][:, :mask_index], dim=-1)  # (M, num_bins), no mask class
    nll = -log_p.gather(-1, x0[masked][:, None]).squeeze(-1)  # (M,)
    per_cell = torch.zeros(x0.shape[0], device=nll.device).index_add_(0, rows, nll)  # (B,)
    elbo = elbo_weight(noise, t.float()) * per_cell / x0.shape[1]
    return LossTerms(elbo=elbo, nll_sum=nll.sum(), n_masked=int(rows.numel()))


@torch.no_grad()
def heldout_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor | None,
    noise: Noise,
    graph: AbsorbingGraph,
    policy: PrecisionPolicy,
    *,
    t_eps: float = 1e-3,
    batch_size: int = 64,
    repeats: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """ELBO (nats/gene) and masked cross-entropy of ``model`` (eval mode) on ``tokens`` (N, G).

    Draws t and masks from a generator seeded with ``seed``, so repeated calls are comparable.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    elbo_sum, nll_sum, n_masked, n_cells = 0.0, 0.0, 0, 0
    for _ in range(repeats):
        for lo in range(0, tokens.shape[0], batch_size):
            x0 = tokens[lo : lo + batch_size].to(device)
            y = None if labels is None else labels[lo : lo + batch_size].to(device)
            xt, t, sigma = noise_batch(x0, noise, graph, generator, t_eps)
            with policy.autocast():
                logits = forward_logits(model, xt, sigma, y)
            terms = loss_terms(logits.float(), x0, xt, t, noise, graph.dim - 1)
            elbo_sum += float(terms.elbo.sum())
            nll_sum += float(terms.nll_sum)
            n_masked += terms.n_masked
            n_cells += x0.shape[0]
    model.train(was_training)
    return {"elbo": elbo_sum / max(n_cells, 1), "masked_ce": nll_sum / max(n_masked, 1)}
