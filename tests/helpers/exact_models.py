"""Exact models for sampler tests (``sedd.eval.exact``), and the no-collision bound."""

from __future__ import annotations

import math

from sedd.eval.exact import ExactModel, potts_distribution, state_index

__all__ = ["ExactModel", "no_collision_probability", "potts_distribution", "state_index"]


def no_collision_probability(num_positions: int, steps: int, eps: float) -> float:
    """P(no two positions unmask in the same step) for a log-linear masked sampler.

    Unmask times are i.i.d. uniform on [0, 1]; the sampler's bins are ``steps`` intervals of width
    (1 - eps) / steps plus the final denoise bin [0, eps]. If no two positions share a bin, the
    sampler reveals positions one at a time from exact conditionals, so its output law is exact:
    TV(sampler, truth) <= 1 - this probability.
    """
    widths = [(1 - eps) / steps] * steps + [eps]
    # elementary symmetric polynomial e_L(widths) by dynamic programming
    e = [1.0] + [0.0] * num_positions
    for w in widths:
        for k in range(num_positions, 0, -1):
            e[k] += e[k - 1] * w
    return math.factorial(num_positions) * e[num_positions]
