"""scDesign's count-level table: KS 0 for a copy of the held-out cells, large for shifted counts
or for genes that co-vary where the held-out ones do not; generated and training cells compared
at the same number of cells."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sedd.eval.count_table import STATISTICS, count_table, count_table_json, pair_correlations

RNG = np.random.default_rng(0)
HELD_OUT = RNG.poisson(RNG.gamma(1.0, 1.0, size=30), size=(80, 30))
TRAIN = RNG.poisson(RNG.gamma(1.0, 1.0, size=30), size=(120, 30))


def test_a_copy_of_the_held_out_cells_is_at_ks_zero_on_every_statistic():
    table = count_table(HELD_OUT.copy(), HELD_OUT, TRAIN, n_genes=10)
    assert list(table) == list(STATISTICS)
    assert all(row.generated_vs_held_out == 0.0 for row in table.values())
    assert all(row.train_vs_held_out is not None for row in table.values())


def test_tripled_counts_are_far_on_counts_and_library_size_but_not_on_kendall():
    table = count_table(3 * HELD_OUT, HELD_OUT, n_genes=10)
    assert table["cell_library_size"].generated_vs_held_out == 1.0
    assert table["gene_mean"].generated_vs_held_out > 0.3
    assert table["gene_pair_kendall"].generated_vs_held_out == 0.0  # ranks are unchanged
    assert table["gene_mean"].train_vs_held_out is None


def test_genes_that_co_vary_are_far_on_pair_correlations():
    shared = RNG.poisson(4.0, size=(80, 1))
    coupled = RNG.poisson(0.5, size=(80, 30)) + shared  # every pair correlates
    table = count_table(coupled, HELD_OUT, n_genes=10)
    assert table["gene_pair_pearson"].generated_vs_held_out > 0.9
    assert table["gene_pair_kendall"].generated_vs_held_out > 0.9


def test_constant_genes_are_left_out_of_pairs_and_the_json_says_its_scale():
    counts = np.column_stack([np.arange(6), np.zeros(6), np.arange(6)[::-1]])
    pearson, kendall = pair_correlations(counts)
    assert pearson.tolist() == pytest.approx([-1.0]) and kendall.tolist() == pytest.approx([-1.0])
    written = json.loads(json.dumps(count_table_json(count_table(TRAIN, HELD_OUT, n_genes=5))))
    assert written["scale"] == "counts"
    assert set(written["statistics"]) == set(STATISTICS)
    assert written["cells"] == {"held_out": 80, "generated": 120, "train": None}


def test_gene_counts_must_match():
    with pytest.raises(ValueError, match="same genes"):
        count_table(HELD_OUT[:, :5], HELD_OUT)


def _law(rng: np.random.Generator, n: int) -> np.ndarray:
    """Poisson counts of 30 genes whose cells vary in depth (a spread of library sizes)."""
    rates = np.random.default_rng(1).gamma(1.0, 1.0, size=30)  # the same genes every call
    return rng.poisson(rates * rng.lognormal(0.0, 0.5, size=(n, 1)))


def test_many_generated_cells_are_compared_at_the_training_cells_number():
    # 300 generated cells of the held-out cells' own law against 30 training cells of it: at
    # 300 cells the per-cell rows read 0.06, at 30 both sides read the 30-cell level (0.14-0.16)
    rng = np.random.default_rng(1)
    held_out, generated, train = _law(rng, 300), _law(rng, 300), _law(rng, 30)
    table = count_table(generated, held_out, train, n_genes=10)
    assert {(row.n_cells, row.n_held_out, row.train_draws) for row in table.values()} == {
        (30, 300, 1)
    }
    for name in ("cell_zero_fraction", "cell_library_size"):
        row = table[name]
        assert row.generated_vs_held_out > 0.1
        assert abs(row.generated_vs_held_out - row.train_vs_held_out) < 0.05
    cells = count_table_json(table)["cells"]
    assert cells == {"held_out": 300, "generated": 30, "train": 30}


def test_the_training_row_is_the_mean_over_draws_at_the_generated_number():
    table = count_table(HELD_OUT[:40], HELD_OUT, TRAIN, n_genes=10, draws=4)
    row = table["cell_library_size"]
    assert (row.n_cells, row.train_draws) == (40, 4) and row.train_vs_held_out_sd is not None
    once = count_table(HELD_OUT[:40], HELD_OUT, TRAIN, n_genes=10, draws=1)
    assert once["cell_library_size"].train_vs_held_out_sd is None
    same = count_table(TRAIN, HELD_OUT, TRAIN.copy(), n_genes=10)  # one draw: all of them
    assert all(r.generated_vs_held_out == r.train_vs_held_out for r in same.values())
    with pytest.raises(ValueError, match="`draws` must be >= 1, got 0"):
        count_table(TRAIN, HELD_OUT, TRAIN, draws=0)
