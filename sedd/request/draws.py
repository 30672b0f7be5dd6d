"""Several draws of each imputed cell, and their mean: the expected counts given what was observed
(what scvi-tools users get from ``get_normalized_expression(n_samples=...)``, in counts).

A request of N cells with ``n_samples = k`` samples every cell k times. Draw j of cell i is cell
number ``j * N + i`` of the request's random streams, so draw 0 is the cell a one-draw request
gives (``.X`` never changes with k) and every draw is fixed by the seed alone, whatever the batch,
the device or the front door. The output keeps draw 0's counts in ``.X`` and adds their mean over
the k draws as ``layers[MEAN_LAYER]`` (float32); observed genes keep their count in every draw, so
the mean there is the observed count exactly.

With ``expected`` the output also holds ``layers[EXPECTED_LAYER]``: per draw, each gene's mean
count under the distribution it was drawn from (``sedd.diffusion.expected``), averaged over the k
draws the same way. It estimates the same conditional mean as ``MEAN_LAYER`` with less noise (a
Rao-Blackwellised mean); observed genes hold their count there too.
"""

from __future__ import annotations

import numpy as np

MAX_N_SAMPLES = 64  # draws of a cell: the cost grows k-fold, and the mean's error as 1/sqrt(k)
MEAN_LAYER = "mean_of_draws"  # the output's layer holding the mean over the draws
EXPECTED_LAYER = "expected_counts"  # the layer holding the expected counts, over the draws


def check_n_samples(n_samples: object) -> None:
    """Refuse ``n_samples`` unless it is an integer from 1 to ``MAX_N_SAMPLES`` (a bool is not)."""
    integer = isinstance(n_samples, int | np.integer) and not isinstance(n_samples, bool)
    if not integer or not 1 <= n_samples <= MAX_N_SAMPLES:  # type: ignore[operator]
        raise ValueError(
            f"`n_samples` must be an integer from 1 to {MAX_N_SAMPLES}, got {n_samples!r}; pass "
            "how many draws of each cell to average (1: the sampled counts only)."
        )


def draw_cell_index(cell: int, draw: int, num_cells: int) -> int:
    """The random stream of draw ``draw`` of cell ``cell`` of a request of ``num_cells`` cells."""
    return draw * num_cells + cell


class DrawMean:
    """The mean of k draws of the same cells (their counts, or their expected counts), added one
    draw at a time: summed in float64, divided once, stored as float32."""

    def __init__(self, n_samples: int) -> None:
        self.n_samples = n_samples
        self.added = 0
        self._sum: np.ndarray | None = None  # (B, G) float64

    def add(self, counts: np.ndarray) -> None:
        """One draw's (B, G) counts (integers, or float32 expected counts)."""
        if self._sum is None:
            # precision: a float64 sum of integer counts is exact (far below 2**53); of float32
            # expected counts, off by float64 rounding, far below the float32 it is stored as
            self._sum = np.zeros(counts.shape, dtype=np.float64)
        self._sum += counts
        self.added += 1

    @property
    def complete(self) -> bool:
        return self.added == self.n_samples

    def mean(self) -> np.ndarray:
        """(B, G) float32: the sum over all ``n_samples`` draws divided by ``n_samples``."""
        if self._sum is None or not self.complete:  # a bug, not a user error
            raise ValueError(f"{self.added} of {self.n_samples} draws added; add them all first.")
        return (self._sum / self.n_samples).astype(np.float32)  # precision: stored as float32


def mean_of_draws(counts: np.ndarray, n_samples: int) -> np.ndarray:
    """(N, G) float32 mean of ``counts`` (k * N, G), whose row ``j * N + i`` is draw j of cell i
    (one job holding every draw, as the server runs it); counts or expected counts."""
    draws = DrawMean(n_samples)
    for part in np.split(counts, n_samples):  # draw j: rows j*N .. (j+1)*N
        draws.add(part)
    return draws.mean()
