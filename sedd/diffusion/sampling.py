"""The reverse step: transition probabilities, fp64 draws, the final denoise. No loop here.

A ``Sampler`` holds the model, noise schedule, graph and precision policy; it keeps no per-request
state, so one instance serves any number of requests. The loop over time (``time_grid``) is
``sedd.diffusion.reference`` for one request (st3's samplers run it) and the batching engine's
(``sedd.engine``) for many: every product path runs the engine, whose cells equal the reference's.

Randomness is counter-based (``sedd.diffusion.randomness``): the uniform that row b draws at gene g
is Philox of (seed, cell, step, g), so a cell's draws depend on nothing but (seed, cell index), and
every row of a block gets its numbers in one chain of integer ops.

The reverse step from time t to s < t (per row) at the positions that can still change:

* Euler (Lou et al. 2024, eq. 17): p(x_s = y) = 1[y = x] + (t - s) sigma'(t) R_rev(x, y), with the
  reverse rate R_rev(x, y) = Q(y, x) s_theta(x)_y.
* Analytic / Tweedie tau-leaping:
  p(x_s = y) = ``[exp(-dsigma Q) s_theta](y)`` * exp(dsigma Q)(x, y), dsigma = sigma(t) - sigma(s).
* A row with s == 0 takes the final denoise: the analytic step at dsigma = sigma(t), with the
  absorbing mask removed from the candidates, so the mask is never emitted.

An x0 model (st3) predicts p(x_0 | x_t); under the absorbing graph its concrete score at a masked
position is s_y = p(x_0 = y | x_t) / (e^sigma - 1) for y != mask (and 1 at the mask itself). With
log-linear noise both predictors then unmask exactly (t - s) / t of the masked positions, 1/N at
the first of N uniform steps (st3 draws p_unmask = 1 - exp(-sigma'(t) dt), ~100% at t = 1).

Static shapes, no host syncs. ``Sampler.propose`` computes the transition at every position of a
fixed row block and keeps the old token where the position cannot change (``torch.where``, not a
boolean gather), so its shapes depend only on the block, it never reads a value back, and on CUDA it
can be captured once and replayed (``sedd.diffusion.cuda_graphs``). What the host must know (rows
whose output was not finite, positions left to unmask) comes back as one small (B, 2) tensor that
the caller reads once (``Proposal.summary``); ``Sampler.step`` does that for callers outside the
engine and recomputes non-finite rows in fp32 (docs/precision.md rule 5).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from sedd.defaults import PREDICTORS, Predictor
from sedd.diffusion.categorical import chunk_sums, sample_categorical, temper
from sedd.diffusion.cuda_graphs import BlockResult, GraphedSteps
from sedd.diffusion.expected import commit_expected
from sedd.diffusion.graph import Graph
from sedd.diffusion.noise import Noise
from sedd.diffusion.randomness import Purpose, cell_uniforms
from sedd.diffusion.schedule import time_grid
from sedd.diffusion.step_rows import StepBranches, StepRows
from sedd.diffusion.steps import ReverseStep, StepTimes, kinds_in, per_kind
from sedd.diffusion.steps.base import tweedie_transition
from sedd.precision import (
    PrecisionPolicy,
    ScoreModel,
    fixed_blocks,
    fp32_fallback,
    resolve_precision,
)

DenoiseMode = Literal["sample", "argmax"]
Redo = tuple["Proposal", np.ndarray]  # rule 5's recomputed rows and their readback

__all__ = [
    "DenoiseMode",
    "Predictor",
    "Proposal",
    "Sampler",
    "StepBranches",
    "StepOutput",
    "StepRows",
    "sample_categorical",
    "start_tokens",
    "time_grid",  # sedd.diffusion.schedule's, here too: the step maths and the grid it runs on
]


@dataclass(frozen=True)
class Proposal:
    """What ``Sampler.propose`` returns, all on the device, nothing read back yet."""

    tokens: torch.Tensor  # (B, L) the new tokens; the input is not modified
    nonfinite: torch.Tensor  # (B,) bool: the row's output held NaN/Inf where it could change
    active: torch.Tensor  # (B,) int64: positions that can still change after the step
    model_calls: int  # model forwards run (row blocks)
    expected: torch.Tensor | None = None  # (B, L) float32 for rows with ``StepRows.expected``

    def summary(self) -> torch.Tensor:
        """(B, 2) int64 [non-finite, still active]: the one small tensor the host reads back."""
        return torch.stack([self.nonfinite.long(), self.active], dim=1)


@dataclass(frozen=True)
class StepOutput:
    """What ``Sampler.step`` returns (diffusers' ``SchedulerOutput``, for discrete tokens)."""

    tokens: torch.Tensor  # (B, L) the new tokens; the input is not modified
    fp32_fallback_rows: tuple[int, ...] = ()  # rows whose score was recomputed in fp32
    model_calls: int = 0  # model forwards run: row blocks, plus any fp32 recomputation
    active: np.ndarray | None = None  # (B,) per row, the positions that can still change
    expected: torch.Tensor | None = None  # (B, L) float32: ``StepRows.expected`` moved on


# Real tokens (V - 1) from which the absorbing step takes softmax over whole rows with the mask's
# logit at -inf: the same numbers as over the real tokens alone once they fill a CPU vector
# register (up to 64 fp32 lanes). ATen sums a row shorter than a register element by element
# and a longer one lane-wise, so a trailing 0 changes no sum only past the first register.
WHOLE_ROW_SOFTMAX_FROM = 64


def start_tokens(
    graph: Graph,
    num_rows: int,
    num_genes: int,
    device: torch.device | str = "cpu",
    *,
    seed: int = 0,
    first_cell: int = 0,
) -> torch.Tensor:
    """(num_rows, num_genes) tokens at t = 1: all-mask for the absorbing graph; for the uniform
    graph, row r drawn uniformly from the START stream of cell (seed, first_cell + r)."""
    if graph.absorb:
        return graph.sample_limit(num_rows, num_genes, device=device)
    cells = torch.arange(first_cell, first_cell + num_rows, device=device)
    seeds = torch.full_like(cells, seed)
    u = cell_uniforms(seeds, cells, torch.zeros_like(cells), num_genes, Purpose.START)
    return (u * graph.dim).long().clamp_max(graph.dim - 1)  # (num_rows, num_genes)


class Sampler:
    """The reverse step over a score model (see ``sedd.models.st3`` for the protocol).

    ``predictor`` is the default Euler or analytic (Tweedie) step of rows that do not choose
    (``StepRows.kind`` chooses per row, ``sedd.diffusion.steps``). ``use_amp``/``amp_dtype``
    follow st3's constructor; ``precision`` (a resolved ``PrecisionPolicy``) overrides them.
    ``cuda_graphs`` replays each fixed-shape block step from a captured CUDA graph (CUDA only;
    eager elsewhere).
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
        cuda_graphs: bool = False,
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
        self.block_rows = block_rows  # rows per forward (``sedd.engine.forwards``); None: the batch
        if predictor is not None:
            self.predictor = predictor
        self.graphs = GraphedSteps(self._block_step, enabled=cuda_graphs, device=self.device)

    # ---- the step -------------------------------------------------------------------------

    def step(self, rows: StepRows, branches: StepBranches | None = None) -> StepOutput:
        """One reverse step of every row from its t to its s (rows with s == 0 are denoised).

        For callers outside the engine: reads the result back once (one host sync) and
        recomputes rows whose output was not finite in fp32. Raises ``NonFiniteScoreError`` when
        fp32 fails too. Rows with nothing left to change come back unchanged.
        """
        branches = StepBranches.of_rows(rows) if branches is None else branches
        proposal = self.propose(rows, branches)
        return self.settle(rows, branches, proposal, proposal.summary().cpu().numpy())

    def propose(self, rows: StepRows, branches: StepBranches, *, amp: bool = True) -> Proposal:
        """The step's new tokens on the device, with no host sync: the model runs on blocks of
        exactly ``block_rows`` rows (the last padded with copies of its last row), and each block
        is one fixed-shape computation (one CUDA graph replay where graphs are on)."""
        parts: list[BlockResult] = []
        for lo, hi, index in fixed_blocks(rows.num_rows, self.block_rows, rows.x.device):
            tokens, nonfinite, active, expected = self.graphs.run(rows.take(index), branches, amp)
            mine = None if expected is None else expected[: hi - lo]
            parts.append((tokens[: hi - lo], nonfinite[: hi - lo], active[: hi - lo], mine))
        if len(parts) == 1:
            tokens, nonfinite, active, expected = parts[0]
            return Proposal(tokens, nonfinite, active, 1, expected)
        joined = zip(*(q[:3] for q in parts), strict=True)
        tokens, nonfinite, active = (torch.cat(p) for p in joined)
        kept = [q[3] for q in parts if q[3] is not None]  # every block's, or none
        expected = torch.cat(kept) if kept else None
        return Proposal(tokens, nonfinite, active, len(parts), expected)

    def settle(
        self, rows: StepRows, branches: StepBranches, proposal: Proposal, summary: np.ndarray
    ) -> StepOutput:
        """Finish a proposal given its ``summary`` (B, 2) as read back: rows whose output was not
        finite are stepped again with autocast off (rule 5), drawing the same uniforms."""
        bad = np.flatnonzero(summary[:, 0])
        active = summary[:, 1].copy()
        if not bad.size:
            return StepOutput(proposal.tokens, (), proposal.model_calls, active, proposal.expected)

        def recompute(index: torch.Tensor, amp: bool) -> tuple[Redo, np.ndarray]:
            redo = self.propose(rows.take(index), branches, amp=amp)
            redone = redo.summary().cpu().numpy()  # [non-finite, still active] per row
            return (redo, redone), redone[:, 0] != 0

        index, (redo, redone) = fp32_fallback(bad, rows.x.device, recompute)
        active[bad] = redone[:, 1]
        tokens = proposal.tokens.index_copy(0, index, redo.tokens)
        expected = proposal.expected
        if expected is not None and redo.expected is not None:
            expected = expected.index_copy(0, index, redo.expected)
        calls = proposal.model_calls + redo.model_calls
        return StepOutput(tokens, tuple(bad.tolist()), calls, active, expected)

    def model_calls(self, rows: int) -> int:
        """Model forwards that ``rows`` rows take: one per block of ``block_rows`` (one in all
        without blocks); 0 rows take none."""
        if rows <= 0:
            return 0
        return 1 if self.block_rows is None else -(-rows // self.block_rows)

    def _active(self, x: torch.Tensor, fixed: torch.Tensor | None) -> torch.Tensor:
        """(B, L) bool: positions whose token can still change."""
        active = self.graph.active_positions(x)
        return active if fixed is None else active & ~fixed

    def _block_step(self, rows: StepRows, branches: StepBranches, amp: bool) -> BlockResult:
        """One fixed-shape block: forward, transition, fp64 draw. (tokens, nonfinite, active,
        expected: None unless the rows carry ``StepRows.expected``).

        Each row takes its own kind of step (``rows.kind``, ``sedd.diffusion.steps``); only the
        kinds in ``branches`` are computed, and each is kept on its own rows."""
        x = rows.x  # (b, L)
        active = self._active(x, rows.fixed)
        kinds = kinds_in(branches)
        t = rows.t  # (b,) fp64; an adaptive kind reads its rows' time off their tokens
        for index, kind in kinds:
            if (own_t := kind.row_time(x, self.graph, self.noise)) is not None:
                t = torch.where(rows.kind == index, own_t, t)
        sigma_t = self.noise.total_noise(t)  # (b,) fp64
        out = self.precision.block_scores(  # (b, L, V) fp32
            self.model, x, sigma_t.float(), rows.labels, rows.cell_types, amp=amp
        )
        final = rows.s <= 0  # (b,)
        sigma_s = torch.where(final, 0.0, self.noise.total_noise(rows.s.clamp_min(0)))
        times = StepTimes(replace(rows, t=t), sigma_t, sigma_s, final, self.noise)
        stay = sums = None  # under the absorbing graph: the weight of staying masked, apart
        if self.graph.absorb:  # only masked positions change: the transition out of the mask
            probs, stay, sums = self._unmask_probs(out, times, kinds)
            # NaN/+Inf in the output reaches its jumps' sums or its stay: no pass over (b, L, V)
            finite = torch.isfinite(sums.sum(dim=-1) + stay)
        else:
            finite = torch.isfinite(out.sum(dim=-1))  # a NaN/Inf anywhere makes it non-finite
            probs = self._transition_probs(out, x, times, kinds, branches.any_final)
        nonfinite = (~finite & active).any(dim=-1)  # (b,)
        if branches.any_tempered:  # only tempered rows take temper: T = 1 rows stay exact
            temp = rows.temperature[:, None, None]  # (b, 1, 1)
            # the token a position stays on: under the absorbing graph, the mask (its column is
            # 0 here and the stay is kept apart, so temper leaves both as they are)
            current = torch.full_like(x, self.graph.dim - 1) if self.graph.absorb else x
            probs = torch.where(temp != 1, temper(probs, current, temp), probs)
        changing = active  # (b, L): the positions this step may change
        for index, kind in kinds:
            if stay is not None and (chosen := kind.choose(probs, stay, active, rows)) is not None:
                changing = torch.where((rows.kind == index)[:, None], active & chosen, changing)
        uniforms = cell_uniforms(rows.seed, rows.cell, rows.step, x.shape[1])  # (b, L) fp64
        # under the absorbing graph every entry is >= 0 (c s_y, and the stay clamped)
        drawn = sample_categorical(
            probs.flatten(0, 1), uniforms.flatten(), nonnegative=self.graph.absorb,
            stay=None if stay is None else stay.flatten(),
            # T != 1: the sums anew
            sums=None if sums is None or branches.any_tempered else sums.flatten(0, 1),
        ).view_as(x)  # fmt: skip
        if self.denoise_mode == "argmax" and branches.any_final:
            # a final row's stay is 0: the argmax is over the real tokens (the mask column is 0)
            drawn = torch.where(final[:, None], probs.argmax(dim=-1), drawn)
        tokens = torch.where(changing, drawn, x)  # (b, L)
        expected = None  # each committed gene's mean count, from the probs it was drawn from
        if rows.expected is not None:
            expected = commit_expected(rows.expected, probs, tokens, changing, self.graph.dim - 1)
        return tokens, nonfinite, self._active(tokens, rows.fixed).sum(dim=1), expected

    def _score(self, out: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Concrete score (ratios), (b, L, V) fp32, for either parametrisation."""
        if self.model.parametrisation == "score":
            return out.exp()
        # x0: p(x_0 | x_t) over real tokens, divided by e^sigma - 1; the mask's own entry is 1.
        mask = self.graph.dim - 1
        log_p0 = torch.log_softmax(out[..., :mask], dim=-1)  # (b, L, V-1), mask class excluded
        log_scale = torch.log(torch.expm1(sigma.float()))[:, None, None]  # (b, 1, 1)
        score = torch.exp(log_p0 - log_scale)
        return torch.cat([score, torch.ones_like(score[..., :1])], dim=-1)

    def _unmask_probs(
        self, out: torch.Tensor, times: StepTimes, kinds: list[tuple[int, ReverseStep]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unnormalised p(x_s = y | x_t = mask) at every position: the jumps (b, L, V) fp32 with
        the mask's column 0, the stay p(mask) (b, L) fp32 apart, and the jumps' chunk sums
        (b, L, C) (``chunk_sums``: the draw's first level, and what they moved, from one pass;
        non-finite where the output was). Overwrites ``out``.

        Under the absorbing graph only masked positions can change (the others are kept by
        ``torch.where`` in the step), so only the transition out of the mask is needed. Every
        kind then takes one form, with the score s over the real tokens and S = sum_y s_y:
        p(y) = c s_y for y != mask, p(mask) = s_mask - c S (Euler: s_mask = 1, as its reverse
        rate's diagonal is -S), with the kind's c (``ReverseStep.unmask_coefficient``: Euler
        (t - s) sigma'(t), analytic e^dsigma - 1). The final denoise takes the analytic c at
        dsigma = sigma(t) and never emits the mask: p(mask) = 0, as for a kind that commits.

        Every op is over whole rows of V, in place where it can be: a slice of the V - 1 real
        tokens would be copied (strided) by softmax, and a (b, L, V) buffer for the stay's one
        column would be written for it.
        """
        rows, sigma_t, final = times.rows, times.sigma_t, times.final
        mask = self.graph.dim - 1
        c = per_kind(rows, kinds, lambda kind: kind.unmask_coefficient(times))
        c = torch.expm1(sigma_t) if c is None else torch.where(final, torch.expm1(sigma_t), c)
        analytic = rows.kind == PREDICTORS.index("analytic")
        tweedie = final | analytic  # (b,) the rows whose stay is the model's own mask score
        committing = final.clone()  # (b,) rows that never stay masked
        for index, kind in kinds:
            if kind.commits:
                committing |= rows.kind == index
        # (b,)
        column = torch.full((1,), mask, device=out.device)  # index_fill_ writes (b, L), no view
        if self.model.parametrisation == "x0":  # s_y = p0_y / (e^sigma - 1), s_mask = 1
            scale = (c / torch.expm1(sigma_t)).float()[:, None, None]  # (b, 1, 1)
            if mask >= WHOLE_ROW_SOFTMAX_FROM:  # the mask's logit at -inf: p0 over the rest
                with torch.inference_mode():  # `out` may be the forward's own (inference) tensor
                    out.index_fill_(-1, column, -torch.inf)
                jumps = torch.softmax(out, dim=-1).mul_(scale)  # (b, L, V), 0 at the mask
            else:  # a short row: softmax over the real tokens' slice (a small copy), padded
                jumps = F.pad(torch.softmax(out[..., :mask], dim=-1).mul_(scale), (0, 1))
            own: torch.Tensor | float = 1.0
        else:
            jumps = out.exp()  # (b, L, V) the score
            own = torch.where(tweedie[:, None], jumps[..., mask], 1.0)  # (b, L)
            jumps.mul_(c.float()[:, None, None]).index_fill_(-1, column, 0.0)
        # the stay is the only entry that can be negative: clamped here, on (b, L), so the draw
        # skips a pass over (b, L, V) (it counts negatives as 0: the same numbers)
        sums = chunk_sums(jumps.flatten(0, 1)).view(*jumps.shape[:2], -1)  # (b, L, C)
        moved = sums.sum(dim=-1)  # (b, L): the mask's column is 0
        stay = torch.where(committing[:, None], 0.0, own - moved).clamp_min(0)  # (b, L)
        return jumps, stay, sums

    def _transition_probs(
        self,
        out: torch.Tensor,
        current: torch.Tensor,
        times: StepTimes,
        kinds: list[tuple[int, ReverseStep]],
        any_final: bool,
    ) -> torch.Tensor:
        """Unnormalised p(x_s = y | x_t) at every position, (b, L, V) fp32, for any graph.

        Each row takes its kind's ``transition`` (Euler, or the analytic update); rows at the
        final denoise take the analytic update. Only the kinds present are computed.
        """
        score = self._score(out, times.sigma_t)
        probs = per_kind(
            times.rows, kinds, lambda kind: kind.transition(times, score, current, self.graph)
        )
        if probs is None:  # every row is at its final denoise
            return tweedie_transition(times, score, current, self.graph)
        if any_final:
            denoised = tweedie_transition(times, score, current, self.graph)
            probs = torch.where(times.final[:, None, None], denoised, probs)
        return probs
