"""scDesign's count-level table: KS 0 for a copy of the held-out cells, large for shifted counts
or for genes that co-vary where the held-out ones do not."""

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


def test_gene_counts_must_match():
    with pytest.raises(ValueError, match="same genes"):
        count_table(HELD_OUT[:, :5], HELD_OUT)
