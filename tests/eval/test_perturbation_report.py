"""The perturbation report on a SEMI-SYNTHETIC screen with planted truth (real PBMC counts,
planted effects): it finds the planted genes and LFCs, its ceiling beats its baseline, and a
right prediction (a redraw of the planted process) beats deliberately wrong ones."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from planted_screens import small_screen

from sedd.eval.heldout_split import held_out_mask, read_split_json
from sedd.eval.perturbation import PerturbationOptions, PerturbationReport, evaluate_perturbations
from sedd.eval.perturbation_files import write_report_files
from sedd.eval.perturbation_metrics import normalised_rank, w2_distance
from sedd.eval.planted_screen import CONTROL_LABEL, apply_effect

SCREEN = small_screen(cells=40, n_control=60)
OPTIONS = PerturbationOptions(CONTROL_LABEL)


def report_for(labels: np.ndarray, counts: np.ndarray | None = None) -> PerturbationReport:
    generated = SCREEN.redraw.counts if counts is None else counts
    return evaluate_perturbations(
        SCREEN.real.counts,
        SCREEN.real.labels,
        generated,
        labels,
        SCREEN.genes,
        OPTIONS,
        pca_fit_counts=SCREEN.train.counts,
    )


RIGHT = report_for(SCREEN.redraw.labels)


def mean(report: PerturbationReport, metric: str, method: str = "model") -> float:
    return report.summary()["metrics"][metric][method]["mean"]


def test_planted_genes_are_found_with_their_planted_fold_changes():
    found = 0
    for pert, effect in SCREEN.effects.items():
        rows = {r["gene"]: r for r in RIGHT.de_rows if r["perturbation"] == pert}
        planted = effect.log2_factors()
        real_lfc = [rows[g]["lfc_real"] for g in planted]
        assert np.corrcoef(real_lfc, list(planted.values()))[0, 1] > 0.75
        for gene, lfc in planted.items():
            if rows[gene]["significant"]:
                found += 1
                assert np.sign(rows[gene]["lfc_real"]) == np.sign(lfc)
    assert found / sum(len(e.genes) for e in SCREEN.effects.values()) >= 0.6


def test_redraw_recovers_the_fold_changes_and_the_ceiling_beats_the_baseline():
    assert mean(RIGHT, "lfc_pearson") > 0.85
    assert 0.7 < mean(RIGHT, "lfc_slope") < 1.3
    assert mean(RIGHT, "rank") == 0.0
    ceiling, baseline = "split_half_ceiling", "cell_mean_baseline"
    assert mean(RIGHT, "lfc_pearson", ceiling) > mean(RIGHT, "lfc_pearson", baseline) + 0.3
    assert mean(RIGHT, "rank", ceiling) == 0.0
    assert mean(RIGHT, "rank", baseline) >= 0.5
    assert mean(RIGHT, "frechet", ceiling) < mean(RIGHT, "frechet", baseline)


def test_shuffled_labels_and_control_cells_score_worse_than_the_redraw():
    shuffled = report_for(np.random.default_rng(0).permutation(SCREEN.redraw.labels))
    control = SCREEN.redraw.counts[SCREEN.redraw.labels == CONTROL_LABEL]  # (60, G)
    as_perturbed = np.resize(np.array(list(SCREEN.effects)), len(control))
    all_control = report_for(as_perturbed, control)
    for wrong in (shuffled, all_control):
        assert mean(wrong, "lfc_pearson") < mean(RIGHT, "lfc_pearson") - 0.15
        assert mean(wrong, "rank") >= 0.5
        assert mean(wrong, "mmd2_rbf") > mean(RIGHT, "mmd2_rbf")
        assert mean(wrong, "frechet") > mean(RIGHT, "frechet") + 20


def test_every_side_of_a_comparison_has_the_same_number_of_cells():
    for pert, sides in RIGHT.sides.items():
        sizes = {name: len(rows) for name, rows in sides.items()}
        assert set(sizes.values()) == {20}, (pert, sizes)
        assert not set(sides["reference"]) & set(sides["split_half_ceiling"])
    capped = evaluate_perturbations(
        SCREEN.real.counts,
        SCREEN.real.labels,
        SCREEN.redraw.counts,
        SCREEN.redraw.labels,
        SCREEN.genes,
        PerturbationOptions(CONTROL_LABEL, max_cells=7),
    )
    assert {r["n_cells_per_side"] for r in capped.per_perturbation.values()} == {7}


def test_w2_of_a_shifted_copy_is_the_shift():
    points = np.random.default_rng(0).normal(size=(12, 3))
    assert w2_distance(points, points + np.array([3.0, 4.0, 0.0])) == pytest.approx(5.0)
    assert w2_distance(points, points[::-1]) == pytest.approx(0.0, abs=1e-12)


def test_rank_is_zero_for_exact_profiles_and_a_half_for_one_shared_response():
    reference = np.eye(5) * 3.0  # (P, G): five distinct profiles
    assert normalised_rank(reference, reference).tolist() == [0.0] * 5
    collapsed = np.tile(reference.mean(axis=0), (5, 1))  # every prediction the same
    assert normalised_rank(collapsed, reference).mean() == pytest.approx(0.0)
    collapsed_on_first = np.tile(reference[0], (5, 1))
    assert normalised_rank(collapsed_on_first, reference).tolist() == [0.0] + [0.25] * 4


def test_thinning_and_poisson_addition_scale_the_gene_mean():
    rng = np.random.default_rng(0)
    counts = rng.poisson(5.0, size=(4000, 3))
    shares = np.full(3, 1 / 3)
    out = apply_effect(counts, np.array([0, 1]), np.array([0.25, 3.0]), shares, rng)
    ratios = out.mean(axis=0) / counts.mean(axis=0)
    assert ratios == pytest.approx([0.25, 3.0, 1.0], rel=0.03)


def test_report_files_say_their_scale_and_hold_every_method(tmp_path):
    paths = write_report_files(RIGHT, tmp_path, {"semi_synthetic": True})
    assert sorted(p.name for p in paths) == [
        "de_tables.csv",
        "per_pert_metrics.csv",
        "per_pert_metrics.json",
        "summary_metrics.json",
    ]
    summary = json.loads((tmp_path / "summary_metrics.json").read_text())
    assert summary["scale"] == "log1p_cp10k"
    assert summary["metrics"]["rank"]["model"] == {"mean": 0.0, "std": 0.0, "n": 4}
    assert "equal_cells" in summary["params"]
    rows = list(csv.DictReader((tmp_path / "per_pert_metrics.csv").open()))
    assert [r["perturbation"] for r in rows] == ["SYN-P01", "SYN-P02", "SYN-P03", "SYN-P04"]
    assert {"w2", "w2_baseline", "w2_ceiling", "lfc_pearson_ceiling"} <= set(rows[0])


def test_scldm_split_json_keeps_listed_perturbations_and_control(tmp_path):
    import pandas as pd

    path = tmp_path / "split.json"
    path.write_text(json.dumps({"cell_type": [], "pert": ["SYN-P02"]}))
    obs = pd.DataFrame({"perturbation": ["SYN-P01", "SYN-P02", CONTROL_LABEL, "SYN-P02"]})
    mask = held_out_mask(
        obs, read_split_json(path), pert_key="perturbation", control_label=CONTROL_LABEL
    )
    assert mask.tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="--cell-type-key"):
        held_out_mask(
            obs, {"cell_type": ["B"], "pert": []}, pert_key="perturbation", control_label="x"
        )


def test_a_missing_control_label_is_a_one_line_error():
    with pytest.raises(ValueError, match="control label 'ctrl' has 0 real cells"):
        evaluate_perturbations(
            SCREEN.real.counts,
            SCREEN.real.labels,
            SCREEN.redraw.counts,
            SCREEN.redraw.labels,
            SCREEN.genes,
            PerturbationOptions("ctrl"),
        )


def _write_screen(path, draw, split: np.ndarray | None = None) -> None:
    import anndata as ad
    import pandas as pd

    obs = pd.DataFrame({"perturbation": draw.labels.astype(str)})
    if split is not None:
        obs["split"] = split
    obs.index = [f"c{i}" for i in range(len(obs))]
    adata = ad.AnnData(draw.counts.astype(np.float32), obs=obs)
    adata.var_names = SCREEN.genes
    adata.uns["semi_synthetic"] = True
    adata.uns["control_label"] = CONTROL_LABEL
    adata.write_h5ad(path)


def test_sedd_evaluate_perturbation_writes_the_report_on_the_held_out_split(tmp_path, capsys):
    from sedd.cli import main

    real = np.concatenate([SCREEN.real.labels, SCREEN.train.labels])
    stacked = type(SCREEN.real)(
        np.vstack([SCREEN.real.counts, SCREEN.train.counts]), real, np.arange(len(real))
    )
    split = np.repeat(["test", "train"], [len(SCREEN.real.labels), len(SCREEN.train.labels)])
    _write_screen(tmp_path / "real.h5ad", stacked, split)
    _write_screen(tmp_path / "gen.h5ad", SCREEN.redraw)
    argv = ["evaluate", "--perturbation", "--real", str(tmp_path / "real.h5ad")]
    argv += ["--generated", str(tmp_path / "gen.h5ad"), "--split-value", "test"]
    assert main([*argv, "--out-dir", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "SEMI-SYNTHETIC" in printed and "split_half_ceiling" in printed
    summary = json.loads((tmp_path / "out" / "summary_metrics.json").read_text())
    assert summary["inputs"]["held_out"] == {"key": "split", "value": "test"}
    assert summary["params"]["pca_fit_on"].endswith("(out of sample)")
    # The same cells and options as RIGHT, so the same figures.
    assert summary["metrics"]["lfc_pearson"]["model"]["mean"] == pytest.approx(
        mean(RIGHT, "lfc_pearson")
    )
    # st3's generation_metrics files sit beside the report, on the held-out cells' counts.
    import anndata as ad

    from sedd.eval.st3_metrics import compute_st3_metrics

    held = ad.read_h5ad(tmp_path / "real.h5ad")
    held = held[held.obs["split"] == "test"]
    expected = compute_st3_metrics(
        held, ad.read_h5ad(tmp_path / "gen.h5ad"), real_key="perturbation"
    )
    written = json.loads(
        (tmp_path / "out" / "generation_metrics_per_perturbation.json").read_text()
    )
    assert written == json.loads(json.dumps(expected.per_perturbation))
    assert len(written) == len(set(SCREEN.real.labels.astype(str)))
    assert (tmp_path / "out" / "generation_metrics_aggregate.json").is_file()
