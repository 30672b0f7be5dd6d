"""Counter-based randomness (``sedd.diffusion.randomness``): Philox-4x32 known answers, the
exactness of the int64 arithmetic, the statistical quality of the uniforms and the purity of
``cell_uniforms``.

All draws are deterministic, so every statistical threshold below is a fixed pass or fail: the
thresholds are loose enough (p > 1e-3, |r| < 5 / sqrt(n)) that a sound generator passes them with
room to spare and a broken counter layout (repeated or shifted streams) fails them outright.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from devices import DEVICE, needs_cuda
from scipy import stats

from sedd.diffusion.randomness import (
    MAX_CELLS,
    MAX_SEED,
    Purpose,
    _cell_words,
    _mulhilo,
    cell_uniforms,
    philox4x32,
    uniform53,
)

MASK32 = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
P_MIN = 1e-3  # smallest p-value a statistical test may give

# Random123 tests/kat_vectors, philox4x32: rounds, counter[4], key[2] -> output[4]
PI_COUNTER = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
PI_KEY = (0xA4093822, 0x299F31D0)
KNOWN_ANSWERS = [
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (10, (MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (10, PI_COUNTER, PI_KEY, (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    (7, (0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    (7, (MASK32,) * 4, (MASK32,) * 2, (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (7, PI_COUNTER, PI_KEY, (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
]
KAT_IDS = ["zeros-10", "ones-10", "pi-10", "zeros-7", "ones-7", "pi-7"]


def _words(values) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor(v, dtype=torch.int64) for v in values)


def _as_ints(words) -> tuple[int, ...]:
    return tuple(int(w) for w in words)


def _reference_philox(counter, key, rounds=10) -> tuple[int, int, int, int]:
    """Philox-4x32 on Python integers, straight from Salmon et al. (SC'11)."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for round_index in range(rounds):
        if round_index > 0:
            k0 = (k0 + WEYL[0]) & MASK32
            k1 = (k1 + WEYL[1]) & MASK32
        product0 = MULTIPLIERS[0] * x0
        product1 = MULTIPLIERS[1] * x2
        x0, x1, x2, x3 = (
            (product1 >> 32) ^ x1 ^ k0,
            product1 & MASK32,
            (product0 >> 32) ^ x3 ^ k1,
            product0 & MASK32,
        )
    return x0, x1, x2, x3


def _reference_draw(seed: int, cell: int, step: int, position: int, purpose: Purpose) -> float:
    """The documented layout: key = seed's words, counter = (gene pair, step, cell low, cell
    high | purpose << 16); an even gene takes words (0, 1), an odd gene words (2, 3); 27 bits of
    the first above 26 bits of the second."""
    counter = (position // 2, step & MASK32, cell & MASK32, (cell >> 32) | (int(purpose) << 16))
    words = _reference_philox(counter, (seed & MASK32, seed >> 32))
    high, low = words[2 * (position % 2) : 2 * (position % 2) + 2]
    return (((high >> 5) << 26) | (low >> 6)) / 2.0**53


def _uniforms(seed: int, cells: range, step: int, positions: int, purpose=Purpose.STEP):
    n = len(cells)
    return cell_uniforms(
        torch.full((n,), seed, dtype=torch.int64),
        torch.arange(cells.start, cells.stop, dtype=torch.int64),
        torch.full((n,), step, dtype=torch.int64),
        positions,
        purpose,
    )


def _assert_independent(x: torch.Tensor, y: torch.Tensor) -> None:
    """Paired streams look independent: tiny Pearson r, and a 16 x 16 joint histogram that a
    chi-square test of independence accepts."""
    x, y = x.reshape(-1).numpy(), y.reshape(-1).numpy()
    n = x.size
    assert n >= 100_000
    r = np.corrcoef(x, y)[0, 1]
    assert abs(r) < 5 / math.sqrt(n), r
    joint = np.bincount((x * 16).astype(np.int64) * 16 + (y * 16).astype(np.int64), minlength=256)
    assert stats.chi2_contingency(joint.reshape(16, 16)).pvalue > P_MIN


# --- 1,000 cells x 1,000 gene positions of seed 0, step 0: 10^6 draws, computed once ---

SEED, CELLS, POSITIONS = 0, range(0, 1000), 1000
PAIRED_CELLS = range(0, 250)  # the other streams are compared on 250 x 1000 = 250,000 pairs


@pytest.fixture(scope="module")
def block() -> torch.Tensor:
    return _uniforms(SEED, CELLS, 0, POSITIONS)


# --- Philox-4x32 known answers ---


@pytest.mark.parametrize(("rounds", "counter", "key", "expected"), KNOWN_ANSWERS, ids=KAT_IDS)
def test_philox_matches_random123_known_answer_vectors(rounds, counter, key, expected):
    assert _as_ints(philox4x32(_words(counter), _words(key), rounds=rounds)) == expected


@pytest.mark.parametrize(("rounds", "counter", "key", "expected"), KNOWN_ANSWERS, ids=KAT_IDS)
def test_python_reference_philox_matches_known_answer_vectors(rounds, counter, key, expected):
    # the reference that the layout tests below trust is itself pinned to the published answers
    assert _reference_philox(counter, key, rounds) == expected


def test_philox_default_is_ten_rounds():
    counter, key, expected = KNOWN_ANSWERS[2][1:]
    assert _as_ints(philox4x32(_words(counter), _words(key))) == expected


def test_philox_batch_of_counters_equals_each_counter_alone():
    gen = torch.Generator().manual_seed(7)
    counters = torch.randint(0, 2**32, (4, 64), generator=gen, dtype=torch.int64)
    counters[:, 0] = 0
    counters[:, 1] = MASK32
    keys = torch.randint(0, 2**32, (2, 8, 1), generator=gen, dtype=torch.int64)
    # (8, 1) keys against (64,) counter words broadcast to (8, 64)
    batch = philox4x32(tuple(counters), (keys[0], keys[1]))
    assert all(word.shape == (8, 64) for word in batch)
    for row in range(8):
        for column in range(64):
            alone = philox4x32(tuple(counters[:, column]), (keys[0, row, 0], keys[1, row, 0]))
            assert _as_ints(w[row, column] for w in batch) == _as_ints(alone)
    # and the int64 words agree with Python integers on a few of them
    for column in (0, 1, 2, 63):
        counter = _as_ints(counters[:, column])
        key = (int(keys[0, 3, 0]), int(keys[1, 3, 0]))
        assert _as_ints(w[3, column] for w in batch) == _reference_philox(counter, key)


def test_philox_output_words_stay_32_bit():
    gen = torch.Generator().manual_seed(11)
    counter = tuple(torch.randint(0, 2**32, (4, 10_000), generator=gen, dtype=torch.int64))
    key = tuple(torch.randint(0, 2**32, (2, 10_000), generator=gen, dtype=torch.int64))
    for word in philox4x32(counter, key):
        assert word.dtype == torch.int64
        assert int(word.min()) >= 0
        assert int(word.max()) <= MASK32
        assert int(word.max()) > 2**31  # the top bit is reached


# --- the 32 x 32 -> 64-bit products in int64 ---

EDGE_WORDS = [
    0,
    1,
    2,
    0xFFFF,
    0x10000,
    0x1FFFF,
    0x7FFFFFFF,
    2**31,
    2**31 + 1,
    0xFFFF0000,
    0x0000FFFF,
    0xFFFEFFFF,
    2**32 - 2,
    2**32 - 1,
    *MULTIPLIERS,
]


@pytest.mark.parametrize("multiplier", MULTIPLIERS, ids=["M0", "M1"])
def test_mulhilo_equals_python_integer_product(multiplier):
    gen = torch.Generator().manual_seed(multiplier)
    random_words = torch.randint(0, 2**32, (20_000,), generator=gen, dtype=torch.int64).tolist()
    words = EDGE_WORDS + random_words
    high, low = _mulhilo(torch.tensor(words, dtype=torch.int64), multiplier)
    expected_high = [(w * multiplier) >> 32 for w in words]
    expected_low = [(w * multiplier) & MASK32 for w in words]
    assert high.tolist() == expected_high
    assert low.tolist() == expected_low


@pytest.mark.parametrize("multiplier", MULTIPLIERS, ids=["M0", "M1"])
def test_mulhilo_of_largest_word_is_exact(multiplier):
    high, low = _mulhilo(torch.tensor([MASK32], dtype=torch.int64), multiplier)
    product = MASK32 * multiplier  # the largest product Philox forms, just under 2^64
    assert (int(high[0]) << 32) + int(low[0]) == product
    assert int(high[0]) == multiplier - 1
    assert int(low[0]) == 2**32 - multiplier


# --- uniform53: 53 bits from two words ---


def test_uniform53_maps_extreme_words_to_zero_and_just_below_one():
    words = torch.tensor([0, MASK32], dtype=torch.int64)
    u = uniform53(words, words)
    assert u.dtype == torch.float64
    assert u[0].item() == 0.0
    assert u[1].item() == (2**53 - 1) / 2**53
    assert u[1].item() < 1.0


def test_uniform53_takes_top_27_bits_of_high_and_top_26_of_low():
    high = torch.tensor([1 << 5, 1 << 4, 0, 0, 0xABCDEF12], dtype=torch.int64)
    low = torch.tensor([0, 0, 1 << 6, 1 << 5, 0x3456789A], dtype=torch.int64)
    bits = (uniform53(high, low) * 2.0**53).to(torch.int64).tolist()
    expected = [1 << 26, 0, 1, 0, ((0xABCDEF12 >> 5) << 26) | (0x3456789A >> 6)]
    assert bits == expected


# --- the 10^6 draws: range, resolution, uniformity ---


def test_draws_are_fp64_in_unit_interval_on_the_2_to_minus_53_grid(block):
    assert block.shape == (len(CELLS), POSITIONS)
    assert block.dtype == torch.float64
    assert float(block.min()) >= 0.0
    assert float(block.max()) < 1.0
    scaled = block * 2.0**53
    assert torch.equal(scaled, torch.floor(scaled))


def test_draws_use_all_53_bits(block):
    bits = (block * 2.0**53).to(torch.int64).reshape(-1)
    n = bits.numel()
    # each bit, low ones included, is set in half the draws
    for bit in range(53):
        frequency = ((bits >> bit) & 1).double().mean().item()
        assert abs(frequency - 0.5) < 2.5 / math.sqrt(n), (bit, frequency)
    # a draw whose low 20 bits are all zero has probability 2^-20: about one in the block
    assert int(((bits & (2**20 - 1)) == 0).sum()) <= 10


def test_draws_do_not_repeat(block):
    # 10^6 draws from 2^53 values: a repeat has probability about 5e-5
    assert torch.unique(block).numel() == block.numel()


def test_draws_pass_kolmogorov_smirnov_against_uniform(block):
    draws = block.reshape(-1).numpy()
    assert draws.size >= 1_000_000
    result = stats.kstest(draws, "uniform")
    assert result.pvalue > P_MIN, result


def test_draws_pass_chi_square_over_1000_equal_bins(block):
    draws = block.reshape(-1).numpy()
    counts = np.bincount((draws * 1000).astype(np.int64), minlength=1000)
    assert counts.size == 1000
    result = stats.chisquare(counts)
    assert result.pvalue > P_MIN, result


def test_draws_mean_and_variance_match_uniform(block):
    n = block.numel()
    assert abs(block.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(block.var().item() - 1 / 12) < 5 * math.sqrt(1 / 180 / n)


# --- independence of neighbouring streams ---


def test_neighbouring_cells_are_uncorrelated(block):
    _assert_independent(block[:-1], block[1:])


def test_neighbouring_gene_positions_are_uncorrelated(block):
    _assert_independent(block[:, :-1], block[:, 1:])


def test_neighbouring_steps_are_uncorrelated(block):
    next_step = _uniforms(SEED, PAIRED_CELLS, 1, POSITIONS)
    _assert_independent(block[: len(PAIRED_CELLS)], next_step)


def test_step_and_start_purposes_are_uncorrelated(block):
    start = _uniforms(SEED, PAIRED_CELLS, 0, POSITIONS, Purpose.START)
    _assert_independent(block[: len(PAIRED_CELLS)], start)


def test_neighbouring_seeds_are_uncorrelated(block):
    other_seed = _uniforms(SEED + 1, PAIRED_CELLS, 0, POSITIONS)
    _assert_independent(block[: len(PAIRED_CELLS)], other_seed)


def test_cell_low_word_wrap_gives_uncorrelated_neighbours():
    # cells 2^32 - 125 .. 2^32 + 124: the low counter word wraps and the high word ticks over
    around_wrap = _uniforms(99, range(2**32 - 125, 2**32 + 125), 3, 1000)
    _assert_independent(around_wrap[:-1], around_wrap[1:])


# --- determinism and purity of cell_uniforms ---


def test_cell_uniforms_follow_the_documented_counter_layout():
    cases = [
        (0, 0, 0, Purpose.STEP),
        (1234, 56, 7, Purpose.START),
        (MAX_SEED, MAX_CELLS - 1, 2**32 - 1, Purpose.STEP),
        (MAX_SEED, MAX_CELLS - 1, 2**32 - 1, Purpose.START),
        (2**32, 2**32, 2**31, Purpose.STEP),
        (2**32 - 1, 2**32 - 1, 1, Purpose.START),
        (2**62 + 12345, 2**47 + 3, 500, Purpose.STEP),
    ]
    positions = 7
    for seed, cell, step, purpose in cases:
        got = cell_uniforms(
            torch.tensor([seed]), torch.tensor([cell]), torch.tensor([step]), positions, purpose
        )
        expected = [_reference_draw(seed, cell, step, g, purpose) for g in range(positions)]
        assert got[0].tolist() == expected, (seed, cell, step, purpose)


def test_a_row_is_the_same_inside_a_batch_as_alone():
    seeds = torch.tensor([0, 5, MAX_SEED, 5, 2**40, 5], dtype=torch.int64)
    cells = torch.tensor([3, 9, MAX_CELLS - 1, 9, 2**33, 10], dtype=torch.int64)
    steps = torch.tensor([0, 4, 2**32 - 1, 5, 17, 4], dtype=torch.int64)
    for purpose in Purpose:
        batch = cell_uniforms(seeds, cells, steps, 300, purpose)
        assert batch.shape == (6, 300)
        for b in range(6):
            alone = cell_uniforms(
                seeds[b : b + 1], cells[b : b + 1], steps[b : b + 1], 300, purpose
            )
            assert torch.equal(batch[b], alone[0])
        # reversing the batch reverses the rows and changes nothing else
        reversed_batch = cell_uniforms(seeds.flip(0), cells.flip(0), steps.flip(0), 300, purpose)
        assert torch.equal(reversed_batch, batch.flip(0))


def test_a_row_does_not_depend_on_how_many_positions_are_drawn():
    args = (torch.tensor([42]), torch.tensor([1000]), torch.tensor([3]))
    long_row = cell_uniforms(*args, 2000)
    short_row = cell_uniforms(*args, 37)
    assert torch.equal(long_row[:, :37], short_row)


def test_cell_uniforms_are_repeatable():
    args = (torch.tensor([8, 9]), torch.tensor([1, 2]), torch.tensor([0, 6]), 50, Purpose.START)
    assert torch.equal(cell_uniforms(*args), cell_uniforms(*args))


@pytest.mark.parametrize(
    ("changed", "other"),
    [
        ("seed", (1, 10, 3, Purpose.STEP)),
        ("cell", (0, 11, 3, Purpose.STEP)),
        ("step", (0, 10, 4, Purpose.STEP)),
        ("purpose", (0, 10, 3, Purpose.START)),
    ],
)
def test_changing_any_coordinate_changes_every_draw(changed, other):
    def row(seed, cell, step, purpose):
        return cell_uniforms(
            torch.tensor([seed]), torch.tensor([cell]), torch.tensor([step]), 500, purpose
        )[0]

    base = row(0, 10, 3, Purpose.STEP)
    assert not torch.any(base == row(*other)), changed


@pytest.mark.parametrize(
    ("large", "small"),
    [
        ((MAX_SEED, 5), (MAX_SEED & MASK32, 5)),  # only the key's high word differs
        ((2**32, 5), (0, 5)),
        ((2**63 - 2**32, 5), (0, 5)),  # low key word equal, high word 2^31 - 1 vs 0
        ((7, MAX_CELLS - 1), (7, (MAX_CELLS - 1) & MASK32)),  # only the cell's high bits differ
        ((7, 2**32), (7, 0)),
        ((7, 2**47), (7, 0)),
    ],
    ids=["max-seed", "seed-2^32", "seed-high-word", "max-cell", "cell-2^32", "cell-2^47"],
)
def test_large_seeds_and_cells_work_and_differ_from_small_ones(large, small):
    def row(seed, cell):
        return cell_uniforms(torch.tensor([seed]), torch.tensor([cell]), torch.tensor([0]), 400)[0]

    big, little = row(*large), row(*small)
    assert torch.all((big >= 0) & (big < 1))
    assert not torch.any(big == little)
    assert big.tolist()[:3] == [_reference_draw(*large, 0, g, Purpose.STEP) for g in range(3)]


def test_purpose_bit_does_not_collide_with_high_cell_bits():
    # a START draw of cell c and a STEP draw of the cell with the same low 32 bits and the
    # largest high bits sit in different counters
    cell = 2**32 + 17
    top = (0xFFFF << 32) | 17
    start = cell_uniforms(
        torch.tensor([3]), torch.tensor([cell]), torch.tensor([1]), 300, Purpose.START
    )
    for other in (cell, top, 17):
        step = cell_uniforms(torch.tensor([3]), torch.tensor([other]), torch.tensor([1]), 300)
        assert not torch.any(start == step), other


def test_purpose_values_are_stable():
    # part of the counter: renumbering them would change every stored sample
    assert int(Purpose.STEP) == 0
    assert int(Purpose.START) == 1
    assert int(Purpose.ORDER) == 2  # the entropy-bounded step's order among genes
    assert len(Purpose) == 3


def test_numpy_and_torch_words_agree_bit_for_bit():
    """The CPU computes the words in NumPy (uint64), an accelerator in torch (int64 halves): the
    same integers, so the same cells on either."""
    seeds = [0, 7, MAX_SEED, 2**32 + 5, 2**62 + 12345]
    cells = [0, 1, MAX_CELLS - 1, 2**32, 2**47 + 3]
    steps = [0, 3, 2**32 - 1, 17, 1000]
    for purpose in Purpose:
        as_torch = [torch.tensor(v, dtype=torch.int64) for v in (seeds, cells, steps)]
        pairs = torch.arange(150, dtype=torch.int64)
        torch_words = _cell_words(*as_torch, pairs, purpose)
        numpy_words = _cell_words(*(np.array(v, dtype=np.uint64) for v in (seeds, cells, steps)),
                                  299, purpose)  # fmt: skip
        for t_word, n_word in zip(torch_words, numpy_words, strict=True):
            assert t_word.shape == (5, 150) and n_word.shape == (5, 150)
            assert t_word.numpy().astype(np.uint64).tolist() == n_word.tolist()


@needs_cuda
def test_cuda_draws_equal_cpu_draws():
    seed = torch.tensor([3, MAX_SEED, 11])
    cell = torch.tensor([0, MAX_CELLS - 1, 2**33])
    step = torch.tensor([0, 9, 2**31])
    for purpose in Purpose:
        cpu = cell_uniforms(seed, cell, step, 1001, purpose)
        cuda = cell_uniforms(seed.to(DEVICE), cell.to(DEVICE), step.to(DEVICE), 1001, purpose)
        assert torch.equal(cuda.cpu(), cpu)
