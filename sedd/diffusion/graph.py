"""Transition graphs of the forward diffusion: absorbing (masked) and uniform.

The operations mirror the SEDD paper (Lou et al. 2024) and its reference code. For a rate matrix
Q (forward process dp_t/dt = sigma'(t) Q p_t), with states along the last axis of size V:

* ``rate(i)``: column i of Q, the forward rates out of state i.
* ``transp_rate(i)``: row i of Q, used to build the reverse rate.
* ``transp_transition(i, sigma)``: row i of exp(sigma Q).
* ``reverse_rate(i, score)``: reverse rates Q^T(i, .) * s(i)_., diagonal set to minus the row sum.
* ``staggered_score(score, dsigma)``: exp(-dsigma Q) applied to the score, the Tweedie
  (analytic) correction between noise levels sigma and sigma - dsigma.
* ``score_entropy(log_score, sigma, x, x0)``: the denoising score-entropy loss per position.

Scores here are ratios s(x)_y = p_t(y) / p_t(x) (not their logs) unless named ``log_score``.
``sigma``/``dsigma`` broadcast against the position shape ``i.shape`` (e.g. (B, 1) or (B, L)).
"""

from __future__ import annotations

import abc

import torch


def one_hot(i: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., dim) one-hot rows of ``i``. Unlike ``F.one_hot`` it does not read ``i``'s range
    back to the host (a sync per call on CUDA); indices come from the sampler, in range."""
    return torch.zeros(*i.shape, dim, dtype=dtype, device=i.device).scatter_(-1, i[..., None], 1)


def _expm1_sigma(sigma: torch.Tensor) -> torch.Tensor:
    """e^sigma - 1, computed as the reference does (expm1 below 0.5, exp - 1 above)."""
    return torch.where(sigma < 0.5, torch.expm1(sigma), torch.exp(sigma) - 1)


class Graph(abc.ABC):
    """A transition graph over ``dim`` states."""

    dim: int

    @property
    @abc.abstractmethod
    def absorb(self) -> bool:
        """True when state ``dim - 1`` is an absorbing mask that must never be emitted."""

    @property
    def mask_index(self) -> int | None:
        return self.dim - 1 if self.absorb else None

    @abc.abstractmethod
    def rate(self, i: torch.Tensor) -> torch.Tensor:
        """Column i of Q: (..., V)."""

    @abc.abstractmethod
    def transp_rate(self, i: torch.Tensor) -> torch.Tensor:
        """Row i of Q: (..., V)."""

    @abc.abstractmethod
    def transp_transition(self, i: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Row i of exp(sigma Q): (..., V)."""

    @abc.abstractmethod
    def staggered_score(self, score: torch.Tensor, dsigma: torch.Tensor) -> torch.Tensor:
        """exp(-dsigma Q) score: approximates p_{sigma - dsigma}(y) / p_sigma(x)."""

    @abc.abstractmethod
    def sample_transition(
        self, i: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw x_t ~ exp(sigma Q)(., i): the forward (noising) process from clean tokens i."""

    @abc.abstractmethod
    def sample_limit(
        self,
        *batch_dims: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Draw from the limiting distribution (t = 1)."""

    @abc.abstractmethod
    def score_entropy(
        self, log_score: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor, x0: torch.Tensor
    ) -> torch.Tensor:
        """Denoising score entropy per position, (...), including its normalising constant."""

    @abc.abstractmethod
    def active_positions(self, x: torch.Tensor) -> torch.Tensor:
        """Positions whose token can still change in the reverse process: (...) bool."""

    def reverse_rate(self, i: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """Reverse rate out of state i: Q(., i)^T * score, with the diagonal = -(row sum)."""
        rate = self.transp_rate(i) * score  # (..., V)
        rate = rate.scatter(-1, i[..., None], 0.0)
        return rate.scatter(-1, i[..., None], -rate.sum(dim=-1, keepdim=True))

    def config(self) -> dict[str, object]:
        return {"type": "absorb" if self.absorb else "uniform", "dim": self.dim}


class AbsorbingGraph(Graph):
    """Every token jumps to the mask ``dim - 1`` at unit rate; the mask never leaves.

    ``num_tokens`` counts the real tokens; ``dim = num_tokens + 1`` includes the mask.
    """

    def __init__(self, num_tokens: int) -> None:
        if num_tokens < 1:
            raise ValueError(f"AbsorbingGraph needs num_tokens >= 1, got {num_tokens}.")
        self.num_tokens = num_tokens
        self.dim = num_tokens + 1

    @property
    def absorb(self) -> bool:
        return True

    def rate(self, i: torch.Tensor) -> torch.Tensor:
        mask = torch.full_like(i, self.dim - 1)
        return one_hot(mask, self.dim) - one_hot(i, self.dim)

    def transp_rate(self, i: torch.Tensor) -> torch.Tensor:
        # Row i of Q: -1 on the diagonal; the mask row additionally receives +1 from every state.
        edge = -one_hot(i, self.dim)
        return edge + (i == self.dim - 1).float()[..., None]

    def transp_transition(self, i: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.broadcast_to(sigma, i.shape)
        stay = torch.exp(-sigma)[..., None]  # (..., 1)
        edge = stay * one_hot(i, self.dim, stay.dtype)
        return edge + torch.where(i == self.dim - 1, -torch.expm1(-sigma), 0.0)[..., None]

    def staggered_score(self, score: torch.Tensor, dsigma: torch.Tensor) -> torch.Tensor:
        dsigma = torch.broadcast_to(dsigma, score.shape[:-1])
        scale = torch.exp(dsigma)  # (...)
        out = score * scale[..., None]
        extra = (1 - scale) * score.sum(dim=-1)  # mass moved to the mask column
        return torch.cat([out[..., :-1], (out[..., -1] + extra)[..., None]], dim=-1)

    def sample_transition(
        self, i: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        move_chance = -torch.expm1(-torch.broadcast_to(sigma, i.shape))
        u = torch.rand(i.shape, generator=generator, device=i.device, dtype=move_chance.dtype)
        return torch.where(u < move_chance, self.dim - 1, i)

    def sample_limit(
        self,
        *batch_dims: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        return torch.full(batch_dims, self.dim - 1, dtype=torch.long, device=device)

    def score_entropy(
        self, log_score: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor, x0: torch.Tensor
    ) -> torch.Tensor:
        # Only masked positions contribute: with r = 1 / (e^sigma - 1),
        #   sum_{y != mask} s_y  -  r log s_{x0}  +  r (log r - 1).
        masked = x == self.dim - 1
        ratio = 1.0 / torch.broadcast_to(_expm1_sigma(sigma), x.shape)
        pos = log_score[..., :-1].exp().sum(dim=-1)
        neg = ratio * torch.gather(log_score, -1, x0[..., None]).squeeze(-1)
        const = ratio * (ratio.log() - 1)
        return torch.where(masked, pos - neg + const, torch.zeros_like(pos))

    def active_positions(self, x: torch.Tensor) -> torch.Tensor:
        return x == self.dim - 1


class UniformGraph(Graph):
    """Every token jumps to every other at rate 1/V (normalised so rates stay bounded)."""

    def __init__(self, dim: int) -> None:
        if dim < 2:
            raise ValueError(f"UniformGraph needs dim >= 2, got {dim}.")
        self.dim = dim

    @property
    def absorb(self) -> bool:
        return False

    def rate(self, i: torch.Tensor) -> torch.Tensor:
        edge = torch.full((*i.shape, self.dim), 1.0 / self.dim, device=i.device)
        return edge.scatter(-1, i[..., None], -(self.dim - 1) / self.dim)

    def transp_rate(self, i: torch.Tensor) -> torch.Tensor:
        return self.rate(i)

    def transp_transition(self, i: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        move = -torch.expm1(-torch.broadcast_to(sigma, i.shape))[..., None] / self.dim  # (..., 1)
        trans = move.expand(*i.shape, self.dim)
        stay = 1 - (self.dim - 1) * move
        return trans.scatter(-1, i[..., None], stay)

    def staggered_score(self, score: torch.Tensor, dsigma: torch.Tensor) -> torch.Tensor:
        epow = torch.exp(-torch.broadcast_to(dsigma, score.shape[:-1]))[..., None]  # (..., 1)
        return (epow - 1) / (self.dim * epow) * score.sum(dim=-1, keepdim=True) + score / epow

    def sample_transition(
        self, i: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        move_chance = -torch.expm1(-torch.broadcast_to(sigma, i.shape))
        u = torch.rand(i.shape, generator=generator, device=i.device, dtype=move_chance.dtype)
        other = torch.randint(0, self.dim, i.shape, generator=generator, device=i.device)
        return torch.where(u < move_chance, other, i)

    def sample_limit(
        self,
        *batch_dims: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        return torch.randint(0, self.dim, batch_dims, generator=generator, device=device)

    def score_entropy(
        self, log_score: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor, x0: torch.Tensor
    ) -> torch.Tensor:
        v = self.dim
        esigm1 = torch.broadcast_to(_expm1_sigma(sigma), x.shape)
        ratio = 1 - v / (esigm1 + v)
        at_x = torch.gather(log_score, -1, x[..., None]).squeeze(-1)
        at_x0 = torch.gather(log_score, -1, x0[..., None]).squeeze(-1)
        neg = log_score.mean(dim=-1) - at_x / v
        neg = torch.where(x == x0, ratio * neg, at_x0 / esigm1 + neg)
        const = torch.where(
            x == x0,
            (v - 1) / v * ratio * (ratio.log() - 1),
            ((-ratio.log() - 1) / ratio - (v - 2)) / v,
        )
        score = log_score.exp()
        pos = score.mean(dim=-1) - torch.gather(score, -1, x[..., None]).squeeze(-1) / v
        return pos - neg + const

    def active_positions(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(x, dtype=torch.bool)


def graph_from_config(cfg: dict[str, object]) -> Graph:
    """``{"type": "absorb", "dim": V}`` or ``{"type": "uniform", "dim": V}``."""
    dim = int(cfg["dim"])  # type: ignore[call-overload]
    match cfg.get("type"):
        case "absorb":
            return AbsorbingGraph(dim - 1)
        case "uniform":
            return UniformGraph(dim)
        case other:
            raise ValueError(f"graph type must be 'absorb' or 'uniform', got {other!r}.")
