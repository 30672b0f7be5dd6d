"""Evaluation plots: the PCA overlay coloured by label, correlation heatmaps with gene names."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_hex

from sedd.eval.metrics import evaluate_counts_with_arrays
from sedd.eval.plots import MAX_LABELLED_GENES, correlation_figure, pca_overlay_figure


def test_pca_overlay_colours_each_label_alike_in_real_and_generated() -> None:
    rng = np.random.default_rng(0)
    real, gen = rng.normal(size=(30, 3)), rng.normal(size=(20, 3))
    real_labels = ["B"] * 10 + ["T"] * 20
    gen_labels = ["T"] * 5 + ["B"] * 15
    fig = pca_overlay_figure(real, gen, real_labels=real_labels, gen_labels=gen_labels)
    by_source, by_label = fig.axes
    assert [t.get_text() for t in by_label.get_legend().get_texts()] == ["B", "T"]
    # per label: real dots then generated crosses, in one colour; the labels' colours differ
    real_b, gen_b, real_t, gen_t = by_label.collections
    assert [len(c.get_offsets()) for c in by_label.collections] == [10, 15, 20, 5]
    np.testing.assert_allclose(gen_t.get_offsets(), gen[:5, :2])
    colour = {name: to_hex(c.get_facecolor()[0]) for name, c in (("B", real_b), ("T", real_t))}
    assert to_hex(gen_b.get_facecolor()[0]) == colour["B"] != colour["T"]
    assert len(by_source.collections) == 2  # the by-source panel stays


def test_pca_overlay_without_labels_is_one_panel_and_wrong_lengths_are_refused() -> None:
    pcs = np.zeros((4, 2))
    assert len(pca_overlay_figure(pcs, pcs).axes) == 1
    with pytest.raises(ValueError, match="3 real labels for 4 rows"):
        pca_overlay_figure(pcs, pcs, real_labels=["a"] * 3, gen_labels=["a"] * 4)


def test_evaluation_arrays_carry_the_label_of_every_plotted_cell() -> None:
    rng = np.random.default_rng(1)
    real = rng.poisson(3.0, size=(40, 12))
    gen = rng.poisson(3.0, size=(30, 12))
    real_labels = np.array(["a", "b"] * 20)
    gen_labels = np.array(["b"] * 30)
    genes = [f"g{i}" for i in range(12)]
    _, arrays = evaluate_counts_with_arrays(
        real, gen, genes, real_conditions=real_labels, gen_conditions=gen_labels, n_pcs=3,
        max_cells=25, top_k_genes=10,
    )  # fmt: skip
    assert arrays is not None
    assert len(arrays.real_pc_labels) == len(arrays.real_pcs) == 20  # only "b" is shared
    assert set(arrays.real_pc_labels) == {"b"} and len(arrays.gen_pc_labels) == 25


@pytest.mark.parametrize("num_genes", [8, 100])
def test_correlation_heatmaps_name_genes_thinned_when_many(num_genes: int) -> None:
    rng = np.random.default_rng(num_genes)
    x = rng.normal(size=(200, num_genes))
    corr = np.corrcoef(x, rowvar=False)
    genes = [f"GENE{i}" for i in range(num_genes)]
    fig = correlation_figure(corr, corr, genes=genes)
    heatmaps = fig.axes[:3]  # their colour bars come after
    rows = [t.get_text() for t in heatmaps[0].get_yticklabels()]
    for ax in heatmaps:
        names = [t.get_text() for t in ax.get_xticklabels()]
        assert names == rows  # one gene order: the first panel's rows name every panel's rows
        assert ax is heatmaps[0] or {t.get_text() for t in ax.get_yticklabels()} == {""}
        assert set(names) <= set(genes) and len(set(names)) == len(names)
        if num_genes <= MAX_LABELLED_GENES:
            assert sorted(names) == sorted(genes)
        else:
            assert MAX_LABELLED_GENES // 2 <= len(names) <= MAX_LABELLED_GENES
