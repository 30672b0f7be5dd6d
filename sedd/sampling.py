"""The reverse step: transition probabilities, fp64 draws, the final denoise. No loop here.

A ``Sampler`` holds the model, noise schedule, graph and precision policy; it keeps no per-request
state, so one instance serves any number of requests. The loop over time (``time_grid``) is the
batching engine's (``sedd.engine``): every path that samples cells submits jobs to it, and
``sedd.samplers`` keeps st3's ``EulerSampler(...).sample(...)`` as a thin call into it.

Randomness comes from one ``torch.Generator`` per row (cell): a cell's draws depend only on its
own generator, never on which other rows share its batch. ``cell_generators(seed, cell_indices)``
derives them, so cell i of a request is reproducible from (seed, i) alone.

The reverse step from time t to s < t (per row) at the positions that can still change:

* Euler (Lou et al. 2024, eq. 17): p(x_s = y) = 1[y = x] + (t - s) sigma'(t) R_rev(x, y), with the
  reverse rate R_rev(x, y) = Q(y, x) s_theta(x)_y.
* Analytic / Tweedie tau-leaping: p(x_s = y) = [exp(-dsigma Q) s_theta](y) * exp(dsigma Q)(x, y),
  dsigma = sigma(t) - sigma(s).
* A row with s == 0 takes the final denoise: the analytic step at dsigma = sigma(t), with the
  absorbing mask removed from the candidates, so the mask is never emitted.

An x0 model (st3) predicts p(x_0 | x_t); under the absorbing graph its concrete score at a masked
position is s_y = p(x_0 = y | x_t) / (e^sigma - 1) for y != mask (and 1 at the mask itself). With
log-linear noise both predictors then unmask exactly (t - s) / t of the masked positions, 1/N at
the first of N uniform steps (st3 draws p_unmask = 1 - exp(-sigma'(t) dt), ~100% at t = 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from sedd.graph import Graph
from sedd.noise import Noise
from sedd.precision import PrecisionPolicy, ScoreModel, resolve_precision
from sedd.schedule import time_grid

Predictor = Literal["euler", "analytic"]
DenoiseMode = Literal["sample", "argmax"]

__all__ = [
    "DEFAULT_TOKENS_PER_FORWARD",
    "DenoiseMode",
    "Predictor",
    "Sampler",
    "StepOutput",
    "block_rows_for",
    "cell_generators",
    "sample_categorical",
    "start_tokens",
    "time_grid",  # sedd.schedule's, here too: the step maths and the grid it runs on
]

# Positions handled per chunk of the fp32 transition / fp64 draw work, bounding temporaries.
_CHUNK_POSITIONS = 1 << 16


@dataclass(frozen=True)
class StepOutput:
    """What ``Sampler.step`` returns (diffusers' ``SchedulerOutput``, for discrete tokens)."""

    tokens: torch.Tensor  # (B, L) the new tokens; the input is not modified
    fp32_fallback_rows: tuple[int, ...] = ()  # rows whose score was recomputed in fp32
    model_calls: int = 0  # model forwards run: row blocks, plus any fp32 recomputation


# Tokens (rows x genes) per model forward when none is set: the forward's fixed row block. On CPU
# a 765-gene row costs the same at 1 to 10 rows a forward (33-35 ms in fp32), so the block is one
# such row and a one-cell request pays for no padding; small models still get several rows. On
# a GPU the cost of a forward is mostly fixed, and larger blocks fill it.
DEFAULT_TOKENS_PER_FORWARD = {"cpu": 1024, "cuda": 131072}


def block_rows_for(
    num_genes: int, device: torch.device | str, tokens_per_forward: int | None = None
) -> int:
    """Rows per model forward for a token budget (at least 1): every forward runs on blocks of
    exactly this many rows, so a cell's numbers do not depend on its batch."""
    budget = tokens_per_forward
    if budget is None:
        budget = DEFAULT_TOKENS_PER_FORWARD.get(torch.device(device).type, 32768)
    if budget < 1:
        raise ValueError(f"`tokens_per_forward` must be >= 1, got {budget}.")
    return max(1, budget // max(num_genes, 1))


def cell_generators(
    seed: int,
    cell_indices: Sequence[int] | range,
    device: torch.device | str = "cpu",
    stream: int = 0,
) -> list[torch.Generator]:
    """One generator per cell, seeded from (seed, cell index) through NumPy's SeedSequence.

    Cell i's stream is the same whatever batch, shard or server request it runs in. ``stream``
    1 is a second, independent stream per cell (the uniform graph's starting tokens).
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}.")
    gens = []
    for i in cell_indices:
        entropy = [seed, int(i)] if stream == 0 else [seed, int(i), stream]
        state = np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]
        gens.append(torch.Generator(device=device).manual_seed(int(state)))
    return gens


def start_tokens(
    graph: Graph,
    num_rows: int,
    num_genes: int,
    device: torch.device | str = "cpu",
    *,
    seed: int | None = None,
    first_cell: int = 0,
    generators: Sequence[torch.Generator] = (),
) -> torch.Tensor:
    """(num_rows, num_genes) tokens at t = 1: all-mask for the absorbing graph; for the uniform
    graph, row r drawn from stream 1 of cell (seed, first_cell + r), or without a seed from
    ``generators`` (one per row, or one shared)."""
    if graph.absorb:
        return graph.sample_limit(num_rows, num_genes, device=device)
    if seed is not None:
        generators = cell_generators(seed, range(first_cell, first_cell + num_rows), device, 1)
    if len(generators) == 1:
        return graph.sample_limit(num_rows, num_genes, generator=generators[0], device=device)
    if len(generators) != num_rows:
        raise ValueError(f"need one generator per row: {num_rows} rows, {len(generators)}.")
    rows = [graph.sample_limit(1, num_genes, generator=g, device=device) for g in generators]
    return torch.cat(rows)  # (num_rows, num_genes)


def sample_categorical(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one category per row of ``probs`` (M, V) from fp64 ``uniforms`` (M,).

    Probabilities need not be normalised; negatives count as 0. The CDF is accumulated in fp64,
    so a category of probability 1e-9 is drawn at its rate (fp32 draws lose it). A
    zero-probability category is never returned.
    """
    if uniforms.dtype != torch.float64:
        raise TypeError(
            f"uniforms must be float64 (docs/precision.md rule 4), got {uniforms.dtype}."
        )
    cdf = probs.clamp_min(0).double().cumsum(dim=-1)  # (M, V)
    total = cdf[:, -1:]
    target = torch.minimum(
        uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total))
    )
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def _temper(probs: torch.Tensor, current: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Raise the jump probabilities (all but the current token's) to 1/T, keeping their total.

    For an x0 model this is softmax(logits / T) over the candidates; the chance of moving at all
    (e.g. of unmasking) is unchanged, so temperature alters what is drawn, not when.
    """
    jump = probs.clamp_min(0).scatter(-1, current[:, None], 0.0)  # (M, V)
    mass = jump.sum(dim=-1, keepdim=True)
    log_jump = jump.clamp_min(torch.finfo(jump.dtype).tiny).log() / temperature[:, None]
    tempered = torch.softmax(log_jump.masked_fill(jump <= 0, -torch.inf), dim=-1)
    tempered = torch.nan_to_num(tempered, nan=0.0) * mass
    stay = probs.gather(-1, current[:, None]).clamp_min(0)
    return tempered.scatter(-1, current[:, None], stay)


class Sampler:
    """The reverse step over a score model (see ``sedd.model`` for the protocol).

    ``predictor`` is the default Euler or analytic (Tweedie) step of rows that do not choose
    (``step(analytic=...)`` chooses per row). ``use_amp``/``amp_dtype`` follow st3's constructor;
    ``precision`` (a resolved ``PrecisionPolicy``) overrides them.
    """

    predictor: Predictor = "euler"

    def __init__(
        self,
        model: ScoreModel,
        noise: Noise,
        graph: Graph,
        use_amp: bool = True,
        amp_dtype: torch.dtype = torch.bfloat16,
        *,
        device: torch.device | str | None = None,
        precision: PrecisionPolicy | None = None,
        denoise: DenoiseMode = "sample",
        predictor: Predictor | None = None,
        block_rows: int | None = None,
    ) -> None:
        if model.vocab_size != graph.dim:
            raise ValueError(
                f"model vocab_size {model.vocab_size} does not match graph dim {graph.dim}."
            )
        if model.parametrisation == "x0" and not graph.absorb:
            raise ValueError("an x0 (clean-token) model needs the absorbing graph.")
        if model.mask_index != graph.mask_index:
            raise ValueError(
                f"model mask_index {model.mask_index} does not match the graph's "
                f"{graph.mask_index}."
            )
        if model.parametrisation not in ("x0", "score"):
            raise ValueError(
                f"model parametrisation must be 'x0' or 'score', got {model.parametrisation!r}."
            )
        if device is None:
            params = list(getattr(model, "parameters", lambda: [])())
            device = params[0].device if params else torch.device("cpu")
        if precision is None:
            name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(amp_dtype, "fp32")
            precision = resolve_precision(name if use_amp else "fp32", device)
        self.model, self.noise, self.graph, self.precision = model, noise, graph, precision
        self.device = torch.device(device)
        self.denoise_mode: DenoiseMode = denoise
        if block_rows is not None and block_rows < 1:
            raise ValueError(f"`block_rows` must be >= 1, got {block_rows}.")
        self.block_rows = block_rows  # rows per model forward (fixed shape); None: the batch
        if predictor is not None:
            self.predictor = predictor

    # ---- the step -------------------------------------------------------------------------

    def step(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        s: torch.Tensor,
        generators: Sequence[torch.Generator],
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        temperature: float | torch.Tensor = 1.0,
        fixed: torch.Tensor | None = None,
        analytic: torch.Tensor | None = None,
    ) -> StepOutput:
        """One reverse step of every row from time t to s (both (B,), fp64; rows may differ).

        x: (B, L) tokens; ``generators``: one per row (each cell its own stream), or a single one
        shared by all rows (one request). Rows with s == 0 are denoised (final step).
        ``fixed`` (B, L) bool marks given positions that never change (imputation).
        ``analytic`` (B,) bool picks the analytic step per row (default: this sampler's
        predictor for all rows), so requests of both predictors can share one forward.
        Returns the new (B, L) tokens (``x`` is not modified) and the rows recomputed in fp32.
        """
        num_rows = x.shape[0]
        if len(generators) not in (1, num_rows):
            raise ValueError(
                f"need one generator per row or one in all: {num_rows} rows, {len(generators)}."
            )
        active = self.graph.active_positions(x)  # (B, L)
        if fixed is not None:
            active &= ~fixed
        if not active.any():
            return StepOutput(x)
        t = t.to(device=x.device, dtype=torch.float64)
        s = s.to(device=x.device, dtype=torch.float64)
        sigma_t = self.noise.total_noise(t)  # (B,)
        out, fallback_rows = self.precision.forward(  # (M, V) fp32 at the active positions
            self.model, x, sigma_t.float(), labels, cell_types, active, self.block_rows
        )
        calls = self.model_calls(num_rows) + self.model_calls(len(fallback_rows))
        per_row = active.sum(dim=1)
        rows = torch.repeat_interleave(torch.arange(num_rows, device=x.device), per_row)  # (M,)
        uniforms = self._uniforms(generators, per_row, x.device)  # (M,) fp64, like x[active]
        temp = torch.as_tensor(temperature, dtype=torch.float32, device=x.device)
        temp = temp.expand(num_rows) if temp.ndim == 0 else temp
        if analytic is None:
            analytic = torch.full((num_rows,), self.predictor == "analytic", device=x.device)
        analytic = analytic.to(x.device)
        if (temp <= 0).any():
            raise ValueError(f"temperature must be > 0, got {temp.min().item()}.")
        current = x[active]
        new = torch.empty_like(current)
        sigma_s = torch.where(s > 0, self.noise.total_noise(s.clamp_min(0)), 0.0)
        for lo in range(0, current.shape[0], _CHUNK_POSITIONS):
            sl = slice(lo, lo + _CHUNK_POSITIONS)
            r = rows[sl]
            tweedie = (s[r] <= 0) | analytic[r]
            probs = self._transition_probs(
                out[sl], current[sl], sigma_t[r], sigma_s[r], t[r], s[r], s[r] <= 0, tweedie
            )
            hot = temp[r] != 1  # only tempered rows go through _temper: T = 1 rows stay exact
            if hot.any():
                probs[hot] = _temper(probs[hot], current[sl][hot], temp[r][hot])
            new[sl] = self._draw(probs, uniforms[sl], s[r] <= 0)
        x_next = x.clone()
        x_next[active] = new
        return StepOutput(x_next, fallback_rows, calls)

    def model_calls(self, rows: int) -> int:
        """Model forwards that ``rows`` rows take: one per block of ``block_rows`` (one in all
        without blocks); 0 rows take none."""
        if rows <= 0:
            return 0
        return 1 if self.block_rows is None else -(-rows // self.block_rows)

    @staticmethod
    def _uniforms(
        generators: Sequence[torch.Generator], per_row: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        """fp64 uniforms for the active positions, row-major, from the rows' generators.

        Consecutive rows sharing one generator (a job with one stream for all its rows) draw in
        one call: the same numbers, in the same order, as one call per row.
        """
        if len(generators) == 1:
            total = int(per_row.sum())
            return torch.rand(total, generator=generators[0], dtype=torch.float64, device=device)
        counts = per_row.tolist()
        runs: list[tuple[torch.Generator, int]] = []
        for g, n in zip(generators, counts, strict=True):
            if runs and runs[-1][0] is g:
                runs[-1] = (g, runs[-1][1] + int(n))
            else:
                runs.append((g, int(n)))
        return torch.cat(
            [
                torch.rand(n, generator=g, dtype=torch.float64, device=device)
                for g, n in runs
                if n > 0
            ]
            or [torch.empty(0, dtype=torch.float64, device=device)]
        )

    def denoise(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        generators: Sequence[torch.Generator],
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        temperature: float | torch.Tensor = 1.0,
        fixed: torch.Tensor | None = None,
    ) -> StepOutput:
        """Final denoise at time t: every remaining mask becomes a real token."""
        return self.step(
            x, t, torch.zeros_like(t), generators, labels, cell_types, temperature, fixed
        )

    def _score(self, out: torch.Tensor, current: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Concrete score (ratios) at active positions, (M, V) fp32, for either parametrisation."""
        if self.model.parametrisation == "score":
            return out.exp()
        # x0: p(x_0 | x_t) over real tokens, divided by e^sigma - 1; the mask's own entry is 1.
        mask = self.graph.dim - 1
        log_p0 = torch.log_softmax(out[:, :mask], dim=-1)  # (M, V-1), mask class excluded
        log_scale = torch.log(torch.expm1(sigma.float()))[:, None]  # (M, 1)
        score = torch.exp(log_p0 - log_scale)
        return torch.cat([score, torch.ones_like(score[:, :1])], dim=-1)

    def _transition_probs(
        self,
        out: torch.Tensor,
        current: torch.Tensor,
        sigma_t: torch.Tensor,
        sigma_s: torch.Tensor,
        t: torch.Tensor,
        s: torch.Tensor,
        final: torch.Tensor,
        tweedie: torch.Tensor,
    ) -> torch.Tensor:
        """Unnormalised p(x_s = y | x_t) at each active position, (M, V) fp32.

        ``tweedie`` (M,) marks positions taking the analytic update (analytic rows and the final
        denoise); the others take the Euler step.
        """
        score = self._score(out, current, sigma_t)
        # Final denoise (and every analytic step) is the Tweedie update at dsigma.
        dsigma = torch.where(final, sigma_t, sigma_t - sigma_s).float()
        if tweedie.all():
            probs = self.graph.staggered_score(score, dsigma) * self.graph.transp_transition(
                current, dsigma
            )
        else:
            dt_rate = ((t - s) * self.noise.rate_noise(t)).float()  # (M,)
            onehot = F.one_hot(current, self.graph.dim).float()
            probs = onehot + dt_rate[:, None] * self.graph.reverse_rate(current, score)
            if tweedie.any():
                d = dsigma[tweedie]
                tw = self.graph.staggered_score(score[tweedie], d)
                probs[tweedie] = tw * self.graph.transp_transition(current[tweedie], d)
        if self.graph.absorb and final.any():
            probs[final, self.graph.dim - 1] = 0.0  # the mask is never emitted
        return probs

    def _draw(
        self, probs: torch.Tensor, uniforms: torch.Tensor, final: torch.Tensor
    ) -> torch.Tensor:
        drawn = sample_categorical(probs, uniforms)
        if self.denoise_mode == "argmax" and final.any():
            drawn[final] = probs[final].argmax(dim=-1)
        return drawn
