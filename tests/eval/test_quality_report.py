"""``sedd quality`` and the report behind it (``sedd.eval.quality_report``), on synthetic cells
whose answers are known: label A holds two clear sub-populations (A1: genes 0-5 high, A2: genes
6-11 high), label B one (genes 12-17 high), with a co-varying module (genes 20-33) where a test
asks for one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scanpy")
pytest.importorskip("igraph")

from sedd.cli import main
from sedd.commands.quality import check_marker_sets, parse_marker_sets
from sedd.eval.markers import PLASMA_LABEL, PLASMA_MARKERS, default_marker_sets
from sedd.eval.quality_report import LabelledCounts, ReportArrays, quality_report
from sedd.eval.report_sets import seed_sets
from sedd.eval.subpopulations import joint_embedding
from sedd.eval.within_label import within_label_agreements

GENES = [f"g{i}" for i in range(40)]
HIGH = {"A1": slice(0, 6), "A2": slice(6, 12), "B": slice(12, 18)}
MODULE = slice(20, 34)  # B's genes that rise and fall together
TRAIN = (("A1", 60), ("A2", 60), ("B", 80))
TEST = (("A1", 15), ("A2", 15), ("B", 20))


def draw(rng: np.random.Generator, spec: tuple[tuple[str, int], ...], module: bool = False):
    """Poisson cells of each (population, count), labelled by the population's first letter."""
    counts, labels = [], []
    for name, n in spec:
        rate = np.full((n, len(GENES)), 0.5)
        rate[:, HIGH[name]] = 8.0
        if name == "B" and module:  # one factor per cell scales the whole module
            rate[:, MODULE] = 4.0 * np.exp(rng.normal(0.0, 1.0, size=(n, 1)))
        counts.append(rng.poisson(rate))
        labels += [name[0]] * n
    return LabelledCounts.of(np.vstack(counts), labels)


def real_cells(module: bool = False) -> tuple[LabelledCounts, LabelledCounts]:
    """The training and held-out cells every report compares with (drawn with seed 0)."""
    rng = np.random.default_rng(0)
    return draw(rng, TRAIN, module), draw(rng, TEST, module)


def report(generated: LabelledCounts, seeds: np.ndarray | None = None, module: bool = False):
    """The report of ``generated`` against ``real_cells``; and the training cells."""
    train, test = real_cells(module)
    if seeds is None:
        seeds = np.zeros(len(generated.labels), dtype=int)
    return quality_report(GENES, train, test, generated, seeds, n_pcs=10), train


def test_only_one_of_two_subpopulations_scores_zero_in_the_other_cluster() -> None:
    only_a1 = draw(np.random.default_rng(1), (("A1", 60), ("B", 40)))
    (result, arrays), _ = report(only_a1)
    a2_cluster = _cluster_of(arrays, slice(60, 120))  # training rows 60..119 are A2
    label_a = result["subpopulations"]["labels"]["A"]
    row = next(c for c in label_a["clusters"] if c["cluster"] == a2_cluster)
    assert row["real_share"] == pytest.approx(0.5, abs=0.05)
    assert row["generated_share_per_seed"] == [row["generated_share_mean"]]
    assert row["generated_share_mean"] <= 0.02
    assert row["generated_within_tolerance_per_seed"] == [False]
    assert label_a["recovered_per_seed"] == [False] and label_a["seeds_recovered"] == 0
    assert result["subpopulations"]["labels"]["B"]["recovered_per_seed"] == [True]


def test_both_subpopulations_are_recovered_within_ten_points() -> None:
    both = draw(np.random.default_rng(1), (("A1", 30), ("A2", 30), ("B", 40)))
    (result, arrays), _ = report(both)
    label_a = result["subpopulations"]["labels"]["A"]
    assert label_a["recovered_per_seed"] == [True]
    shares = {
        c["cluster"]: (c["real_share"], c["generated_share_mean"]) for c in label_a["clusters"]
    }
    for rows in (slice(0, 60), slice(60, 120)):  # A1's and A2's cluster, each half of A
        real, generated = shares[_cluster_of(arrays, rows)]
        assert abs(generated - real) <= 0.10 and real == pytest.approx(0.5, abs=0.05)
    assert result["subpopulations"]["labels_recovered_per_seed"] == [2]
    assert result["subpopulations"]["held_out_labels_recovered"] == 2


def _cluster_of(arrays: ReportArrays, rows: slice) -> str:
    names, counts = np.unique(arrays.embedding.real_clusters[rows], return_counts=True)
    return str(names[np.argmax(counts)])


def test_copies_of_training_cells_trip_the_memorisation_guard() -> None:
    rng = np.random.default_rng(0)
    train = draw(rng, TRAIN)
    (copied, _), _ = report(train)
    guard = copied["memorisation"]
    assert guard["memorising"] is True and guard["exact_copies"] == len(train.labels)
    assert guard["closer_than_held_out_p5"] == 1.0 and guard["generated_median"] == 0.0
    near = train.counts.copy()
    near[:, 39] += 1  # one more count of one gene: no exact copy, still next to its original
    (nearly, _), _ = report(LabelledCounts.of(near, train.labels))
    assert nearly["memorisation"]["exact_copies"] == 0
    assert nearly["memorisation"]["closer_than_held_out_p5"] > 0.5
    assert nearly["memorisation"]["memorising"] is True


def test_fresh_cells_of_the_same_law_pass_the_guard() -> None:
    (result, _), _ = report(draw(np.random.default_rng(7), TEST + TEST))
    guard = result["memorisation"]
    assert guard["memorising"] is False and guard["exact_copies"] == 0
    assert guard["closer_than_held_out_p5"] <= 0.15
    assert guard["verdict"].startswith("no sign of memorisation")


def test_knn_accuracy_of_a_perfectly_labelled_copy_is_one_and_of_swapped_labels_zero() -> None:
    train = draw(np.random.default_rng(0), TRAIN)
    (result, _), _ = report(train)
    knn = result["label_knn_accuracy"]
    assert knn["generated_pooled"]["accuracy"] == 1.0 and knn["held_out"]["accuracy"] == 1.0
    assert knn["generated_accuracy_per_seed"] == [1.0]
    assert knn["cells"] == {"held_out": 50, "generated_per_seed": [50], "generated_pooled": 200}
    swapped = np.where(train.labels == "A", "B", "A")
    (result, _), _ = report(LabelledCounts.of(train.counts, swapped))
    assert result["label_knn_accuracy"]["generated_pooled"]["accuracy"] == 0.0
    assert result["label_knn_accuracy"]["generated_pooled"]["per_label"] == {"A": 0.0, "B": 0.0}
    assert result["label_knn_accuracy"]["generated_accuracy_mean"] == 0.0


def test_distances_sit_at_the_noise_floor_for_the_same_law_and_far_above_for_another() -> None:
    seeds = np.repeat([0, 1, 2], 50)
    same = draw(np.random.default_rng(3), TEST * 3)  # three sets in the held-out mix
    (result, _), _ = report(same, seeds)
    energy = result["distances"]["energy_distance"]
    assert len(energy["generated_per_seed"]) == 3 and len(energy["floor_draws"]) == 5
    assert energy["generated_mean"] == pytest.approx(energy["floor_mean"], rel=0.15)
    mmd = result["distances"]["mmd2_rbf"]
    assert abs(mmd["generated_mean"] - mmd["floor_mean"]) < 0.01 and mmd["floor_mean"] < 0.0
    wrong = draw(np.random.default_rng(3), (("A1", 15), ("A1", 15), ("B", 20)) * 3)
    (result, _), _ = report(wrong, seeds)  # A2 is missing: its cells are A1's
    assert result["distances"]["energy_distance"]["generated_mean"] > 2 * energy["floor_mean"]
    assert result["distances"]["mmd2_rbf"]["generated_mean"] > 0.03


def test_within_label_agreement_sees_the_module_in_real_cells_and_not_in_shuffled_ones() -> None:
    rng = np.random.default_rng(5)
    fresh = draw(rng, TEST, module=True)
    shuffled = fresh.counts.copy()
    b_rows = np.flatnonzero(fresh.labels == "B")
    for gene in range(len(GENES)):  # each gene's values move to other B cells independently
        shuffled[b_rows, gene] = shuffled[rng.permutation(b_rows), gene]
    (result, _), _ = report(LabelledCounts.of(shuffled, fresh.labels), module=True)
    b = result["within_label_agreement"]["per_label"]["B"]
    assert (b["n_train"], b["n_held_out"], b["n_generated_per_seed"]) == (80, 20, [20])
    assert b["held_out"] > 0.4
    assert abs(b["generated_mean"]) < 0.2 and b["generated_per_seed"] == [b["generated_mean"]]
    (result, _), _ = report(fresh, module=True)
    assert result["within_label_agreement"]["per_label"]["B"]["generated_mean"] > 0.4


def test_clusters_and_umap_are_the_same_for_the_same_seed() -> None:
    rng = np.random.default_rng(0)
    real, gen = rng.normal(size=(120, 5)), rng.normal(size=(60, 5))
    first, second = joint_embedding(real, gen, seed=3), joint_embedding(real, gen, seed=3)
    assert np.array_equal(first.real_clusters, second.real_clusters)
    assert np.array_equal(first.gen_clusters, second.gen_clusters)
    assert np.array_equal(first.real_umap, second.real_umap)


def test_marker_sets_default_to_plasma_cells_only_when_the_label_and_genes_exist() -> None:
    genes = [*PLASMA_MARKERS, "CD19"]
    assert default_marker_sets([PLASMA_LABEL, "T"], genes) == {PLASMA_LABEL: list(PLASMA_MARKERS)}
    assert default_marker_sets(["T"], genes) == {}
    assert default_marker_sets([PLASMA_LABEL], genes[1:]) == {}
    assert parse_marker_sets(["CD19+ B=MZB1, IGJ", "T=CD3E"]) == {
        "CD19+ B": ["MZB1", "IGJ"],
        "T": ["CD3E"],
    }
    with pytest.raises(ValueError, match=r"--markers 'B' is not LABEL=GENE1,GENE2"):
        parse_marker_sets(["B"])
    with pytest.raises(ValueError, match=r"gene 'MZB' for 'B' .* \(did you mean 'MZB1'\?\)"):
        check_marker_sets({"B": ["MZB"]}, ["B"], genes)
    with pytest.raises(ValueError, match=r"--markers label 'X' is not a label"):
        check_marker_sets({"X": ["MZB1"]}, ["B"], genes)


# --- the command ------------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["quality", *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_missing_file_is_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.h5ad"
    code, err = _run(["--real", str(missing), "--out", str(tmp_path / "q")], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"sedd quality: error: --real {missing}: no such file;")
    assert not (tmp_path / "q").exists()


def test_an_absent_label_column_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["--condition-key", "cell_type", "--out", str(tmp_path / "q")], capsys)
    assert code == 2 and len(err) == 1
    assert "--condition-key 'cell_type' is not an obs column of --real" in err[0]
    assert "bulk_labels" in err[0]  # the columns there are listed


def test_an_unknown_marker_gene_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--markers", "CD19+ B=MZB1,NOTAGENE", "--out", str(tmp_path / "q")]
    code, err = _run(argv, capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("sedd quality: error: --markers gene 'NOTAGENE' for 'CD19+ B'")


def test_without_the_quality_extra_it_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "igraph", None)  # as if not installed
    code, err = _run(["--out", str(tmp_path / "q")], capsys)
    assert code == 2
    assert err == [
        "sedd quality: error: needs scanpy, igraph and umap-learn (not installed: igraph): "
        "pip install -e '.[quality]'"
    ]


@pytest.mark.slow
def test_the_command_writes_the_report_and_plots_for_the_bundled_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q"
    argv = ["--seeds", "1", "--steps", "2", "--max-cells", "20", "--precision", "fp32"]
    assert main(["quality", *argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sub-population recovery" in printed and "memorisation guard: " in printed
    result = json.loads((out / "quality.json").read_text())
    assert list(result) == [
        "scale", "inputs", "sizes", "pca", "subpopulations", "within_label_agreement",
        "label_knn_accuracy", "distances", "memorisation", "markers", "plots",
    ]  # fmt: skip
    assert result["scale"] == "counts"
    assert result["inputs"]["cells"] == {
        "train": 595, "held_out": 20, "generated": 20, "generated_per_seed": [20]
    }  # fmt: skip
    assert set(result["sizes"]) == set(result) - {"scale", "inputs", "sizes", "pca", "plots"}
    assert result["within_label_agreement"]["all_labels"]["cells"]["generated_per_seed"] == [20]
    assert result["inputs"]["steps"] == 2 and result["inputs"]["seeds"] == [0]
    assert result["subpopulations"]["labels_checked"] == 10
    assert list(result["markers"]) == [PLASMA_LABEL]
    assert result["markers"][PLASMA_LABEL]["genes"] == list(PLASMA_MARKERS)
    assert set(result["markers"][PLASMA_LABEL]["real"]) == {"q10", "q25", "q50", "q75", "q90"}
    assert 0.0 <= result["label_knn_accuracy"]["generated_accuracy_mean"] <= 1.0
    assert result["memorisation"]["exact_copies"] == 0
    assert result["plots"] == ["umap.png", "markers_CD19_B.png"]
    for name in result["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- equal numbers of cells ------------------------------------------------------------------


def test_each_seed_is_scored_alone_at_the_held_out_size() -> None:
    rng = np.random.default_rng(5)
    sets = [draw(rng, TEST, module=True) for _ in range(3)]  # three seeds, the held-out mix
    pooled = LabelledCounts.of(
        np.vstack([s.counts for s in sets]), np.concatenate([s.labels for s in sets])
    )
    (result, _), _ = report(pooled, np.repeat([0, 1, 2], 50), module=True)
    train, test = real_cells(module=True)
    everything = result["within_label_agreement"]["all_labels"]
    assert everything["cells"] == {
        "held_out": 50, "generated_per_seed": [50, 50, 50], "generated_pooled": 150
    }  # fmt: skip
    alone = [
        within_label_agreements(GENES, train, test, s, {0: np.arange(50)})["all_labels"]
        for s in sets
    ]
    assert everything["generated_per_seed"] == [a["generated_mean"] for a in alone]
    assert everything["generated_mean"] == pytest.approx(np.mean(everything["generated_per_seed"]))
    # more cells read higher: the pooled figure is above every seed's
    assert everything["generated_pooled"] > max(everything["generated_per_seed"])
    b = result["within_label_agreement"]["per_label"]["B"]
    assert (b["n_held_out"], b["n_generated_per_seed"], b["n_generated_pooled"]) == (
        20, [20, 20, 20], 60
    )  # fmt: skip
    recovery = result["subpopulations"]
    assert recovery["cells"]["generated_per_seed"] == [50, 50, 50]
    assert len(recovery["labels_recovered_per_seed"]) == 3
    assert result["distances"]["cells"]["generated_per_seed"] == [50, 50, 50]
    assert result["label_knn_accuracy"]["cells"]["generated_pooled"] == 150


def test_a_copy_of_the_held_out_cells_scores_exactly_the_held_out_figures() -> None:
    _, test = real_cells(module=True)
    copies = LabelledCounts.of(np.vstack([test.counts] * 3), np.tile(test.labels, 3))
    (result, _), _ = report(copies, np.repeat([0, 1, 2], 50), module=True)
    agreement = result["within_label_agreement"]
    for entry in [agreement["all_labels"], *agreement["per_label"].values()]:
        assert entry["held_out"] is not None
        assert entry["generated_per_seed"] == [entry["held_out"]] * 3
        assert entry["generated_sd"] == 0.0
    knn = result["label_knn_accuracy"]
    assert knn["generated_accuracy_per_seed"] == [knn["held_out"]["accuracy"]] * 3
    guard = result["memorisation"]
    share = guard["closer_than_held_out_p5_per_seed"][0]
    # the held-out cells' own share: 3 of 50 sit below their interpolated 5th percentile
    assert guard["closer_than_held_out_p5_per_seed"] == [share] * 3 and share == 3 / 50


def test_a_seed_set_larger_than_the_held_out_mix_is_subsampled_to_it() -> None:
    held_out = np.array(["A"] * 10 + ["B"] * 8)
    labels = np.array(["A"] * 30 + ["B"] * 5 + ["B"] * 8 + ["A"] * 10)
    seeds = np.array([0] * 35 + [1] * 18)
    sets = seed_sets(labels, seeds, held_out)
    assert list(sets) == [0, 1]
    assert (labels[sets[0]] == "A").sum() == 10 and (labels[sets[0]] == "B").sum() == 5
    assert sets[1].tolist() == list(range(35, 53))  # the held-out mix: kept whole, in order
