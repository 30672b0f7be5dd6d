"""Counts <-> tokens for count models of single cells.

Token vocabulary (absorbing graphs): a model with ``num_bins`` bins represents the counts
``0..num_bins-1`` as tokens of the same value, and the mask token is ``num_bins``
(vocab = ``num_bins + 1``). The mask is never a count: st3 set ``num_bins`` to the largest
count in the data, so that count collided with the mask and could never be produced. Here a
count ``>= num_bins`` is refused (``CountRangeError``) unless the caller asks to clip it.

Gene names always travel with the tokens (``TokenizedCells.genes``), so a matrix can never be
scored against a model whose gene order differs without someone noticing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

CountMatrix = np.ndarray | sp.spmatrix | sp.sparray | torch.Tensor
# maps the k-th checked value to its (cell, gene) position, for error messages
Locator = Callable[[int], tuple[int, int]]


class CountRangeError(ValueError):
    """Counts that the model's vocabulary cannot represent (count >= num_bins)."""


class CountClipWarning(UserWarning):
    """Counts above the model's range were clipped to ``num_bins - 1``."""


@dataclass
class TokenizedCells:
    """Token matrix ``(N, G)`` int64 with the gene name of every column.

    ``n_clipped`` is the number of entries clipped to ``num_bins - 1`` (0 unless ``clip=True``).
    """

    tokens: torch.Tensor  # (N, G) int64
    genes: list[str]
    n_clipped: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.dim() != 2:
            raise ValueError(
                f"tokens must be a 2-D torch.Tensor (cells, genes), got {_describe(self.tokens)}."
            )
        if self.tokens.dtype != torch.int64:
            raise ValueError(f"tokens must be int64, got {self.tokens.dtype}.")
        self.genes = [str(g) for g in self.genes]
        if len(self.genes) != self.tokens.shape[1]:
            raise ValueError(
                f"genes has {len(self.genes)} names but tokens has {self.tokens.shape[1]} "
                "columns; pass one gene name per column, in the model's gene order."
            )
        if self.n_clipped < 0:
            raise ValueError(f"n_clipped must be >= 0, got {self.n_clipped}.")

    @property
    def n_cells(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_genes(self) -> int:
        return int(self.tokens.shape[1])


def counts_to_tokens(
    counts: CountMatrix,
    num_bins: int,
    *,
    genes: Sequence[str],
    clip: bool = False,
) -> TokenizedCells:
    """Map a (cells, genes) matrix of non-negative integer counts to tokens.

    Count ``c`` becomes token ``c``; counts must lie in ``0..num_bins-1`` (``num_bins`` is the
    mask token). Out-of-range counts raise ``CountRangeError`` unless ``clip=True``, which clips
    them to ``num_bins - 1``, warns (``CountClipWarning``) and reports ``n_clipped``.
    Accepts numpy arrays, scipy sparse matrices/arrays and torch tensors (int or integer-valued
    float). The returned tokens are a CPU int64 tensor.
    """
    _check_num_bins(num_bins)
    genes = [str(g) for g in genes]
    if sp.issparse(counts):
        csr = sp.csr_array(counts, copy=True)
        csr.sum_duplicates()  # canonical: sorted, so stored order is row-major order
        shape = csr.shape
        _check_gene_count(shape, genes)
        values = _validated_values(csr.data, lambda k: _csr_cell_gene(csr, k), genes)
        n_clipped = _check_range(values, lambda k: _csr_cell_gene(csr, k), genes, num_bins, clip)
        csr.data = values
        dense = csr.toarray()
    else:
        array = _dense_numpy(counts)
        if array.ndim != 2:
            raise ValueError(f"counts must be 2-D (cells, genes), got shape {array.shape}.")
        _check_gene_count(array.shape, genes)

        def locate(k: int) -> tuple[int, int]:
            row, col = divmod(int(k), array.shape[1])
            return row, col

        flat = _validated_values(array.reshape(-1), locate, genes)
        n_clipped = _check_range(flat, locate, genes, num_bins, clip)
        dense = flat.reshape(array.shape)
    tokens = torch.from_numpy(np.ascontiguousarray(dense, dtype=np.int64))
    return TokenizedCells(tokens=tokens, genes=genes, n_clipped=n_clipped)


def tokens_to_counts(tokens: torch.Tensor | np.ndarray, mask_index: int | None) -> np.ndarray:
    """Map tokens back to counts (int64 numpy, same shape).

    Raises ``ValueError`` if any position still holds the mask token (a finished sample must
    have none: the mask is never emitted as a count), or holds a token outside the vocabulary.
    ``mask_index=None`` is for uniform-graph models, whose vocabulary has no mask.
    """
    if isinstance(tokens, torch.Tensor):
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must have an integer dtype, got {tokens.dtype}.")
        array = tokens.detach().cpu().numpy()
    elif isinstance(tokens, np.ndarray):
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must have an integer dtype, got {tokens.dtype}.")
        array = tokens
    else:
        raise ValueError(f"tokens must be a torch.Tensor or numpy array, got {_describe(tokens)}.")
    counts = array.astype(np.int64, copy=True)
    if mask_index is not None:
        masked = counts == mask_index
        if masked.any():
            first = tuple(int(i) for i in np.argwhere(masked)[0])
            raise ValueError(
                f"{int(masked.sum())} position(s) still hold the mask token {mask_index} "
                f"(first at index {first}); the mask is not a count. A finished sample must "
                "have every position denoised: run the sampler to t=0 with its final denoise."
            )
    bad = counts < 0 if mask_index is None else (counts < 0) | (counts > mask_index)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        top = "" if mask_index is None else f" (vocabulary 0..{mask_index})"
        raise ValueError(
            f"{int(bad.sum())} token(s) are outside the vocabulary{top}, e.g. "
            f"{int(counts[first])} at index {first}."
        )
    return counts


def _check_num_bins(num_bins: int) -> None:
    if isinstance(num_bins, bool) or not isinstance(num_bins, int | np.integer) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}.")


def _check_gene_count(shape: tuple[int, ...], genes: list[str]) -> None:
    if len(genes) != shape[1]:
        raise ValueError(
            f"genes has {len(genes)} names but counts has {shape[1]} columns; pass one gene "
            "name per column."
        )


def _dense_numpy(counts: object) -> np.ndarray:
    if isinstance(counts, torch.Tensor):
        if counts.is_complex():
            raise ValueError(f"counts must be real numbers, got {counts.dtype}.")
        return counts.detach().cpu().numpy()
    if isinstance(counts, np.ndarray):
        return counts
    raise ValueError(
        "counts must be a numpy array, scipy sparse matrix or torch tensor, got "
        f"{_describe(counts)}."
    )


def _csr_cell_gene(csr: sp.csr_array, k: int) -> tuple[int, int]:
    """(cell, gene) of the k-th stored value of a canonical CSR matrix."""
    row = int(np.searchsorted(csr.indptr, k, side="right") - 1)
    return row, int(csr.indices[k])


def _where(locate: Locator, genes: list[str], k: int) -> str:
    cell, gene = locate(k)
    return f"cell {cell}, gene {genes[gene]!r}"


def _validated_values(values: np.ndarray, locate: Locator, genes: list[str]) -> np.ndarray:
    """Check values are finite non-negative integers; return them as int64."""
    if values.dtype == np.bool_ or not (
        np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)
    ):
        raise ValueError(f"counts must be integers, got dtype {values.dtype}.")
    if np.issubdtype(values.dtype, np.floating):
        finite = np.isfinite(values)
        if not finite.all():
            k = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"counts must be finite; found {int((~finite).sum())} NaN/Inf value(s), first "
                f"at {_where(locate, genes, k)}."
            )
    negative = values < 0
    if negative.any():
        k = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"counts must be non-negative; found {int(negative.sum())} negative value(s) "
            f"(min {values.min()}), first at {_where(locate, genes, k)}. Scaled or z-scored "
            "data are not counts: use raw UMI counts."
        )
    if np.issubdtype(values.dtype, np.floating):
        fractional = values != np.round(values)
        if fractional.any():
            k = int(np.flatnonzero(fractional)[0])
            raise ValueError(
                f"counts must be integers; found {int(fractional.sum())} non-integer value(s), "
                f"e.g. {values[k]} at {_where(locate, genes, k)}. Log-normalised data must be "
                "turned back into counts first (sedd.io.read.read_counts, recover='pbmc')."
            )
    return values.astype(np.int64)


def _check_range(
    values: np.ndarray,
    locate: Locator,
    genes: list[str],
    num_bins: int,
    clip: bool,
) -> int:
    """Refuse (or clip in place) counts >= num_bins; return the number clipped."""
    top = num_bins - 1
    over = values > top
    n_over = int(over.sum())
    if n_over == 0:
        return 0
    max_value = int(values.max())
    if not clip:
        k = int(np.flatnonzero(over)[0])
        raise CountRangeError(
            f"{n_over} count value(s) are out of range for this model (max count {max_value}, "
            f"first at {_where(locate, genes, k)}): a model with num_bins={num_bins} represents "
            f"counts 0..{top} (token {num_bins} is the mask). Pass clip=True (CLI: --clip; "
            f'HTTP: "clip": true) to clip them to num_bins-1 = {top}, or use a model with '
            f"num_bins > {max_value}."
        )
    values[over] = top
    warnings.warn(
        f"clipped {n_over} count value(s) above {top} to {top} (max count was {max_value}; "
        f"the model has num_bins={num_bins}).",
        CountClipWarning,
        stacklevel=3,
    )
    return n_over


def _describe(obj: object) -> str:
    shape = getattr(obj, "shape", None)
    return f"{type(obj).__name__}" + ("" if shape is None else f" of shape {tuple(shape)}")
