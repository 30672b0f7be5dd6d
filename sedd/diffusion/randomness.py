"""Counter-based randomness: every number a cell draws is a pure function of where it is used.

A uniform is Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
the generator behind cuRAND and torch's CUDA generator) applied to

* key     = the request's seed, as two 32-bit words (seed < 2^63);
* counter = (gene pair g // 2, step, cell index low 32 bits, cell index high 16 bits
  | purpose << 16); of the pair's four output words, gene 2p takes words (0, 1) and gene
  2p + 1 words (2, 3).

So the draw at gene g, step k of cell i under ``seed`` is the same number whatever batch, block,
shard, server request or device the cell runs in, with no generator state to carry, save or
restore: a failed forward is retried by computing it again. Every row of a block gets its numbers
in one vectorised chain of integer ops (no per-row launches), and the integer maths is exact on
any device, so CPU and CUDA give the same uniforms.

Each 32-bit word lives in an int64 tensor; the 32 x 32 -> 64-bit products Philox needs are split
into 16-bit halves so that no intermediate leaves int64's range (no overflow, on any backend).
A uniform takes 53 random bits from two words, like NumPy's ``random_double``: fp64 in [0, 1),
a multiple of 2^-53.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TypeVar

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox-4x32 round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments
PHILOX_ROUNDS = 10
MAX_SEED = 2**63 - 1  # the key is the seed's two 32-bit words; int64 holds it on every device
MAX_CELLS = 2**48  # a cell index takes 48 bits of the counter
MAX_STEPS = 2**32


class Purpose(IntEnum):
    """What a draw is for: the same (seed, cell, step, position) gives independent numbers."""

    STEP = 0  # the categorical draw of a reverse step (and of the final denoise)
    START = 1  # the uniform graph's tokens at t = 1
    ORDER = 2  # the entropy-bounded step's order among genes of equal entropy


_Words = TypeVar("_Words", torch.Tensor, np.ndarray)


def _mulhilo(a: _Words, multiplier: int) -> tuple[_Words, _Words]:
    """(high, low) 32-bit words of ``a * multiplier`` for 32-bit ``a``, exactly.

    NumPy uint64 holds the 64-bit product as it is. torch has no uint64 shifts, so in its int64
    the product is split into 16-bit halves and no intermediate leaves int64's range.
    """
    if isinstance(a, np.ndarray):  # uint64
        product = a * multiplier
        return product >> 32, product & _MASK32
    p_low = (a & 0xFFFF) * multiplier  # < 2^48
    p_high = (a >> 16) * multiplier  # < 2^48; the product is p_high * 2^16 + p_low
    low_sum = ((p_high & 0xFFFF) << 16) + p_low  # < 2^49
    return (p_high >> 16) + (low_sum >> 32), low_sum & _MASK32


def philox4x32(
    counter: tuple[_Words, _Words, _Words, _Words],
    key: tuple[_Words, _Words],
    rounds: int = PHILOX_ROUNDS,
) -> tuple[_Words, _Words, _Words, _Words]:
    """Philox-4x32 with ``rounds`` rounds: four 32-bit words out for four in, under a 2-word key.

    The words are int64 tensors or uint64 NumPy arrays holding values in [0, 2^32); they broadcast
    against each other, so a per-row key (B, 1) and a per-position counter word (B, L) give
    (B, L) outputs.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:  # bump the key between rounds
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def uniform53(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """fp64 uniforms in [0, 1) from two 32-bit words: 27 bits of ``high``, 26 of ``low``."""
    bits = ((high >> 5) << 26) | (low >> 6)  # < 2^53, exact in fp64
    return bits.to(torch.float64) * 2.0**-53


def cell_uniforms(
    seed: torch.Tensor,
    cell: torch.Tensor,
    step: torch.Tensor,
    num_positions: int,
    purpose: Purpose = Purpose.STEP,
) -> torch.Tensor:
    """(B, num_positions) fp64 uniforms: row b's at position g is the draw of cell ``cell[b]``
    under ``seed[b]`` at step ``step[b]``, gene g, for ``purpose``.

    One Philox block gives two uniforms: genes 2p and 2p + 1 share the counter word p, gene 2p
    taking words (0, 1) and gene 2p + 1 words (2, 3). ``seed``, ``cell`` and ``step`` are (B,)
    int64 on the device the numbers are wanted on. One vectorised chain of integer ops whatever
    B is: in torch on an accelerator (about 200 element-wise kernels, capturable in a CUDA graph),
    in NumPy on the CPU, where the same words cost a fraction of torch's per-op dispatch for the
    small blocks a CPU runs (``tests/diffusion/test_randomness.py`` checks the two agree bit for
    bit).
    """
    if seed.device.type == "cpu":
        words = _cell_words(seed.numpy().astype(np.uint64), cell.numpy().astype(np.uint64),
                            step.numpy().astype(np.uint64), num_positions, purpose)  # fmt: skip
        return torch.from_numpy(_interleave(*words, num_positions))
    pair = torch.arange((num_positions + 1) // 2, dtype=torch.int64, device=seed.device)
    w0, w1, w2, w3 = _cell_words(seed, cell, step, pair, purpose)
    both = torch.stack([uniform53(w0, w1), uniform53(w2, w3)], dim=-1)  # (B, P, 2)
    return both.flatten(1)[:, :num_positions]  # (B, L)


def _cell_words(
    seed: _Words, cell: _Words, step: _Words, pair: _Words | int, purpose: Purpose
) -> tuple[_Words, _Words, _Words, _Words]:
    """Philox words (B, P) of the cells' gene pairs ``pair`` (a (P,) range, or a count)."""
    if isinstance(pair, int):  # NumPy: the (P,) range of pairs for num_positions genes
        pair = np.arange((pair + 1) // 2, dtype=np.uint64)
    key = ((seed & _MASK32)[:, None], (seed >> 32)[:, None])  # (B, 1) each
    high = ((cell >> 32) | (int(purpose) << 16))[:, None]
    counter = (pair[None, :], (step & _MASK32)[:, None], (cell & _MASK32)[:, None], high)
    return philox4x32(counter, key)  # type: ignore[arg-type]


def _interleave(
    w0: np.ndarray, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray, num_positions: int
) -> np.ndarray:
    """(B, L) fp64 uniforms from NumPy words: gene 2p from (w0, w1), gene 2p + 1 from (w2, w3)."""
    out = np.empty((w0.shape[0], 2 * w0.shape[1]), dtype=np.float64)
    for column, (high, low) in enumerate(((w0, w1), (w2, w3))):
        bits = ((high >> 5) << 26) | (low >> 6)
        out[:, column::2] = bits.astype(np.float64) * 2.0**-53
    return out[:, :num_positions]
