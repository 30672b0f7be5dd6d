"""Score models built from an exactly known joint distribution: the oracle that sampler tests
and the quality-against-steps study (``scripts/quality_vs_steps.py oracle``) measure against.

A Potts-like distribution over ``num_positions`` positions with ``num_tokens`` values each has
strong dependence between positions (configurations with equal neighbours dominate), so a sampler
that draws positions independently (one-shot) cannot reproduce it, and one that unmasks many
positions in one step loses part of it.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn


def potts_distribution(num_positions: int, num_tokens: int, coupling: float) -> torch.Tensor:
    """p(x) proportional to exp(coupling * #{i: x_i == x_{i+1}} + 0.3 * [x_0 == 0]), fp64."""
    states = torch.tensor(list(itertools.product(range(num_tokens), repeat=num_positions)))
    equal_neighbours = (states[:, 1:] == states[:, :-1]).sum(dim=1).double()
    energy = coupling * equal_neighbours + 0.3 * (states[:, 0] == 0).double()
    return torch.softmax(energy, dim=0)


def state_index(x: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Row-wise index of fully unmasked (B, L) tokens into the product order of the joint."""
    weights = num_tokens ** torch.arange(x.shape[1] - 1, -1, -1)
    return (x * weights).sum(dim=1)


class ExactModel(nn.Module):
    """Exact conditionals p(x_0,i = y | visible tokens of x_t) from a known joint.

    ``parametrisation="x0"`` returns log p(x_0 | x_t) as logits (st3 style);
    ``"score"`` returns the SEDD log score log p0 - log(e^sigma - 1) at masked positions and 0
    elsewhere (the reference DDiT's convention). The output passes through an identity matmul so
    that under autocast it comes out in bf16, like a real network's.
    """

    def __init__(
        self, joint: torch.Tensor, num_positions: int, num_tokens: int, parametrisation: str
    ) -> None:
        super().__init__()
        self.parametrisation = parametrisation
        self.num_genes = num_positions
        self.vocab_size = num_tokens + 1
        self.mask_index = num_tokens
        self.num_tokens = num_tokens
        self.register_buffer("table", self._table(joint, num_positions, num_tokens))
        self.register_buffer("eye", torch.eye(self.vocab_size))
        self.autocast_seen: list[bool] = []

    def _table(self, joint: torch.Tensor, length: int, tokens: int) -> torch.Tensor:
        """log p(x_0,i | partial state) for every partial state (tokens + 1)^length, fp32."""
        states = torch.tensor(list(itertools.product(range(tokens), repeat=length)))  # (K, L)
        partial = torch.tensor(list(itertools.product(range(tokens + 1), repeat=length)))
        onehot = nn.functional.one_hot(states, tokens).double()  # (K, L, T)
        parts = []
        for lo in range(0, len(partial), 2048):  # bounded temporaries: (2048, K) at a time
            chunk = partial[lo : lo + 2048]
            visible = chunk != tokens  # (P, L)
            consistent = ((states[None] == chunk[:, None]) | ~visible[:, None]).all(-1)  # (P, K)
            weights = consistent.double() * joint[None]  # (P, K)
            parts.append(torch.einsum("pk,klt->plt", weights, onehot))  # (P, L, T)
        marginals = torch.cat(parts)
        norm = marginals.sum(-1, keepdim=True)
        log_p0 = (marginals / norm.clamp_min(1e-300)).clamp_min(1e-30).log()
        out = torch.zeros(partial.shape[0], length, tokens + 1, dtype=torch.float64)
        out[..., :tokens] = log_p0
        return out.float()

    def forward(
        self, x: torch.Tensor, sigma: torch.Tensor, labels=None, cell_types=None
    ) -> torch.Tensor:
        self.autocast_seen.append(torch.is_autocast_enabled(x.device.type))
        base = self.vocab_size ** torch.arange(x.shape[1] - 1, -1, -1, device=x.device)
        log_p0 = self.table[(x * base).sum(dim=1)]  # (B, L, V)
        if self.parametrisation == "score":
            masked = (x == self.mask_index)[..., None]
            log_scale = torch.log(torch.expm1(sigma.double())).float()[:, None, None]
            log_score = (log_p0 - log_scale).masked_fill(~masked, 0.0)
            log_p0 = log_score.scatter(-1, x[..., None], 0.0)
        return log_p0 @ self.eye  # bf16 under autocast, like a real output layer
