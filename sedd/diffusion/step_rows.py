"""What one reverse step takes, per row, and the host-side facts that choose its code path.

A step moves B rows at once; each row brings its own tokens, times, conditioning and random
stream, so rows of different requests share a forward and each still takes its solo step.
``StepRows`` holds them as (B, ...) tensors on the step's device. ``StepBranches`` holds the few
facts about the rows that decide which branches the step computes (is any row at its final
denoise, tempered; which kinds of step do they take?). The batching engine knows them from its jobs'
settings, so deciding never reads a tensor back from the device: a step makes no host sync and
its shapes do not depend on the data (what a CUDA graph needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from sedd.defaults import PREDICTORS


@dataclass(frozen=True)
class StepRows:
    """The rows of one step; every tensor's first dimension is the row (B)."""

    x: torch.Tensor  # (B, L) long tokens
    t: torch.Tensor  # (B,) fp64, the time each row steps from
    s: torch.Tensor  # (B,) fp64, the time it steps to; 0 is the final denoise
    seed: torch.Tensor  # (B,) int64: with cell and step, the row's random counter
    cell: torch.Tensor  # (B,) int64 cell index: cell i draws from stream (seed, i)
    step: torch.Tensor  # (B,) int64, the row's step number (0 first, steps for the denoise)
    temperature: torch.Tensor  # (B,) fp32
    kind: torch.Tensor  # (B,) int64: the row's reverse step, its index in ``PREDICTORS``
    entropy_bound: torch.Tensor  # (B,) fp64: the entropy-bounded step's bound (nats)
    steps_left: torch.Tensor  # (B,) int64: forwards the row may still take, this one included
    fixed: torch.Tensor | None = None  # (B, L) bool: given positions, never changed
    labels: torch.Tensor | None = None  # (B,) long indices or (B, E) float vectors
    cell_types: torch.Tensor | None = None  # (B,) long
    # (B, L) float32: each gene's expected count so far (``sedd.diffusion.expected``), for rows
    # that ask for it; None: not computed
    expected: torch.Tensor | None = None

    @classmethod
    def of_request(
        cls,
        x: torch.Tensor,
        t: torch.Tensor | float,
        s: torch.Tensor | float,
        *,
        seed: int = 0,
        first_cell: int = 0,
        step: int = 0,
        temperature: float | torch.Tensor = 1.0,
        kind: int | torch.Tensor = 0,
        entropy_bound: float | torch.Tensor = 0.0,
        steps_left: int | torch.Tensor = 1,
        fixed: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        expected: torch.Tensor | None = None,
    ) -> StepRows:
        """Rows of one request: row b is cell ``first_cell + b`` of ``seed``; scalars apply to
        every row."""
        rows, device = x.shape[0], x.device

        def per_row(value: torch.Tensor | float | bool, dtype: torch.dtype) -> torch.Tensor:
            value = torch.as_tensor(value, dtype=dtype, device=device)
            return value.expand(rows).contiguous() if value.ndim == 0 else value

        return cls(
            x=x,
            t=per_row(t, torch.float64),
            s=per_row(s, torch.float64),
            seed=per_row(seed, torch.int64),
            cell=torch.arange(first_cell, first_cell + rows, device=device),
            step=per_row(step, torch.int64),
            temperature=per_row(temperature, torch.float32),
            kind=per_row(kind, torch.int64),
            entropy_bound=per_row(entropy_bound, torch.float64),
            steps_left=per_row(steps_left, torch.int64),
            fixed=fixed,
            labels=labels,
            cell_types=cell_types,
            expected=expected,
        )

    @property
    def num_rows(self) -> int:
        return self.x.shape[0]

    def take(self, index: torch.Tensor | slice) -> StepRows:
        """The rows at ``index`` (a slice is a view; a tensor gathers, e.g. to pad a block)."""
        picked = {
            f.name: None if (value := getattr(self, f.name)) is None else value[index]
            for f in fields(self)
        }
        return StepRows(**picked)

    def tensors(self) -> list[torch.Tensor | None]:
        """Every field, in declaration order (what a captured CUDA graph copies into)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_tensors(cls, values: Sequence[torch.Tensor | None]) -> StepRows:
        return cls(*values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepBranches:
    """Host-side facts about a step's rows that pick what it computes (and key its CUDA graph).

    Each flag only removes work: flags that say "maybe" for everything are always correct.
    ``kinds`` names the reverse steps (``sedd.diffusion.steps``) that rows not at their final
    denoise take; a final row takes the analytic update whatever its kind.
    """

    any_final: bool = True  # some row takes the final denoise (s == 0)
    kinds: frozenset[str] = frozenset(PREDICTORS)
    any_tempered: bool = True  # some row has temperature != 1

    @property
    def any_euler(self) -> bool:
        """Some row takes the Euler step (not at its final denoise)."""
        return "euler" in self.kinds

    @property
    def any_tweedie(self) -> bool:
        """Some row takes the analytic update (the analytic step, or the final denoise)."""
        return self.any_final or "analytic" in self.kinds

    @classmethod
    def of_values(
        cls, s: Sequence[float], kinds: Sequence[str], temperature: Sequence[float]
    ) -> StepBranches:
        """From per-row host values (or, with runs, per-run values: only which occur matters)."""
        final = [value <= 0 for value in s]
        return cls(
            any_final=any(final),
            kinds=frozenset(k for k, f in zip(kinds, final, strict=True) if not f),
            any_tempered=any(value != 1 for value in temperature),
        )

    @classmethod
    def of_rows(cls, rows: StepRows) -> StepBranches:
        """Read from the rows' tensors: a host sync, for callers outside the engine. Reduced on
        the device first (the kinds present among rows not at their final denoise), so the host
        reads a few values, not one per row."""
        final = rows.s <= 0
        codes = torch.unique(rows.kind[~final]).tolist()
        return cls(
            any_final=bool(final.any()),
            kinds=frozenset(PREDICTORS[k] for k in codes),
            any_tempered=bool((rows.temperature != 1).any()),
        )
