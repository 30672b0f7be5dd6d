"""st3's per-perturbation metric files: their exact layout, and the metrics on known answers."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from sedd.commands import evaluate
from sedd.eval.st3_metrics import (
    AGGREGATE_JSON,
    PER_PERTURBATION_CSV,
    PER_PERTURBATION_JSON,
    compute_st3_metrics,
    frechet_distance_pca,
    mmd2_rbf_median,
    perturbation_metrics,
    sliced_w2,
    write_st3_metric_files,
)

RECORD_KEYS = ["w2", "mmd2_rbf", "fd", "n_real", "n_generated"]
STAT_KEYS = ["mean", "median", "std", "min", "max"]


def _cells(n: int, genes: int, seed: int, shift: float = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).poisson(3.0 + shift, size=(n, genes)).astype(np.float64)


def _adata(x: np.ndarray, key: str, labels: list[str], stem: str) -> ad.AnnData:
    return ad.AnnData(
        X=x,
        obs=pd.DataFrame({key: labels}, index=[f"{stem}{i}" for i in range(len(labels))]),
        var=pd.DataFrame(index=[f"g{j}" for j in range(x.shape[1])]),
    )


def _pair() -> tuple[ad.AnnData, ad.AnnData]:
    """Real cells labelled in obs['gene'], generated in obs['perturbation'] (st3's columns):
    KO_B is shifted, KO_C has one generated cell (skipped), ctrl is only real, KO_D only generated.
    """
    real = np.vstack([_cells(30, 12, 0), _cells(25, 12, 1), _cells(6, 12, 2), _cells(8, 12, 3)])
    real_labels = ["KO_A"] * 30 + ["KO_B"] * 25 + ["KO_C"] * 6 + ["ctrl"] * 8
    gen = np.vstack([_cells(20, 12, 4), _cells(35, 12, 5, shift=2.0), _cells(1, 12, 6)])
    gen = np.vstack([gen, _cells(5, 12, 7)])
    gen_labels = ["KO_A"] * 20 + ["KO_B"] * 35 + ["KO_C"] + ["KO_D"] * 5
    return _adata(real, "gene", real_labels, "r"), _adata(gen, "perturbation", gen_labels, "g")


def test_files_have_st3s_names_keys_order_and_formatting(tmp_path: Path) -> None:
    real, gen = _pair()
    metrics = write_st3_metric_files(real, gen, tmp_path)
    assert metrics.skipped == ["KO_C"]

    text = (tmp_path / PER_PERTURBATION_JSON).read_text()
    assert text.startswith('{\n  "KO_A": {\n    "w2": ') and text.endswith("\n  }\n}")
    per = json.loads(text)
    assert list(per) == ["KO_A", "KO_B"]  # shared, >= 2 cells a side, sorted
    for name, record in per.items():
        assert list(record) == RECORD_KEYS
        assert isinstance(record["n_real"], int) and isinstance(record["w2"], float)
        assert record == metrics.per_perturbation[name]
    assert (per["KO_A"]["n_real"], per["KO_A"]["n_generated"]) == (30, 20)
    assert (per["KO_B"]["n_real"], per["KO_B"]["n_generated"]) == (25, 35)

    aggregate_text = (tmp_path / AGGREGATE_JSON).read_text()
    assert aggregate_text.startswith('{\n  "w2": {\n    "mean": ') and aggregate_text.endswith("}")
    aggregate = json.loads(aggregate_text)
    assert list(aggregate) == ["w2", "mmd2_rbf", "fd", "num_perturbations"]
    assert aggregate["num_perturbations"] == 2
    for metric in ("w2", "mmd2_rbf", "fd"):
        assert list(aggregate[metric]) == STAT_KEYS

    lines = (tmp_path / PER_PERTURBATION_CSV).read_text().splitlines()
    assert lines[0] == "perturbation,w2,mmd2_rbf,fd,n_real,n_generated"
    assert [line.split(",")[0] for line in lines[1:]] == ["KO_A", "KO_B"]  # by w2, ascending
    first = lines[1].split(",")
    assert float(first[1]) == per["KO_A"]["w2"] and first[4:] == ["30", "20"]


def test_csv_rows_are_sorted_by_w2_not_by_name(tmp_path: Path) -> None:
    x = _cells(20, 6, 0)
    real = _adata(np.vstack([x, x]), "gene", ["a"] * 20 + ["b"] * 20, "r")
    gen = _adata(np.vstack([x + 5.0, x]), "perturbation", ["a"] * 20 + ["b"] * 20, "g")
    write_st3_metric_files(real, gen, tmp_path)
    rows = (tmp_path / PER_PERTURBATION_CSV).read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["b", "a"]
    assert list(json.loads((tmp_path / PER_PERTURBATION_JSON).read_text())) == ["a", "b"]


def test_aggregate_is_numpys_mean_median_population_std_min_max() -> None:
    real, gen = _pair()
    # Three usable perturbations, so the median is a middle value, not a mean of two.
    extra_real = _adata(_cells(10, 12, 8), "gene", ["KO_E"] * 10, "re")
    extra_gen = _adata(_cells(12, 12, 9, shift=1.0), "perturbation", ["KO_E"] * 12, "ge")
    metrics = compute_st3_metrics(ad.concat([real, extra_real]), ad.concat([gen, extra_gen]))
    assert metrics.aggregate["num_perturbations"] == 3
    for metric in ("w2", "mmd2_rbf", "fd"):
        values = np.array([record[metric] for record in metrics.per_perturbation.values()])
        assert metrics.aggregate[metric] == {
            "mean": float(np.mean(values)),
            "median": float(np.median(values)),
            "std": float(np.std(values)),
            "min": float(np.min(values)),
            "max": float(np.max(values)),
        }


def test_identical_sets_score_zero_on_every_metric() -> None:
    x = _cells(40, 15, 0)
    record = perturbation_metrics(x, x.copy())
    assert record["w2"] == 0.0
    # Identical sets: the unbiased within-set terms sit below the cross term, clipped to 0.
    assert record["mmd2_rbf"] == 0.0
    assert record["fd"] == pytest.approx(0.0, abs=1e-8)
    assert (record["n_real"], record["n_generated"]) == (40, 40)


def test_w2_of_a_shift_is_the_mean_absolute_projection_of_the_shift() -> None:
    x = _cells(30, 8, 0)
    shift = np.arange(1.0, 9.0) / 4
    # Seed 42, 1000 standard-normal rows in order, normalised: st3's directions.
    directions = np.random.RandomState(42).randn(1000, 8)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    expected = np.mean(np.abs(directions @ shift))
    assert sliced_w2(x, x + shift) == pytest.approx(expected, rel=1e-12)
    # On average over directions, E|u . v| = |v| Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)).
    d = 8
    mean_abs = math.gamma(d / 2) / (math.sqrt(math.pi) * math.gamma((d + 1) / 2))
    assert sliced_w2(x, x + shift) == pytest.approx(np.linalg.norm(shift) * mean_abs, rel=0.05)


def test_w2_resamples_unequal_sets_over_ranks() -> None:
    # One gene: every direction is +-1. Real 0..4 read at ranks 0, 2, 4 is exactly 0, 2, 4.
    real = np.arange(5.0)[:, None]
    assert sliced_w2(real, np.array([[0.0], [2.0], [4.0]]), projections=10) == 0.0
    assert sliced_w2(real, np.array([[0.0], [4.0]]), projections=10) == 0.0
    # Real read at ranks 0, 2, 4 vs 1, 2, 3: gaps 1, 0, 1 -> sqrt(2/3) on every direction.
    gap = sliced_w2(real, np.array([[1.0], [2.0], [3.0]]), projections=10)
    assert gap == pytest.approx(math.sqrt(2 / 3), rel=1e-12)


def test_fd_of_a_shift_is_the_squared_shift_in_pca_space() -> None:
    x = _cells(40, 10, 0)
    shift = np.linspace(-1.0, 2.0, 10)
    # 39 >= 10 genes: all 10 components, a rotation, so the full squared norm.
    assert frechet_distance_pca(x, x + shift) == pytest.approx(shift @ shift, rel=1e-6)

    # 30 cells, 60 genes: k = min(50, 29, 29, 60) = 29 components, the top of the real cells'
    # SVD; the shift counts only through its projection onto them.
    wide = _cells(30, 60, 1)
    shift = np.random.default_rng(2).normal(size=60)
    _, _, vt = np.linalg.svd(wide - wide.mean(axis=0), full_matrices=False)
    in_pca = vt[:29] @ shift
    assert frechet_distance_pca(wide, wide + shift) == pytest.approx(in_pca @ in_pca, rel=1e-6)
    assert in_pca @ in_pca < shift @ shift


def test_mmd2_matches_the_hand_computed_median_bandwidth_value() -> None:
    real, gen = np.array([[0.0], [1.0]]), np.array([[5.0], [6.0]])
    # Positive distances among the 4 points: 1, 1, 4, 5, 5, 6 (each twice); median 4.5.
    gamma = 1.0 / (2 * 4.5**2)
    within = math.exp(-gamma)  # k(0, 1) = k(5, 6); U-statistic: the off-diagonal pair only
    cross = (2 * math.exp(-25 * gamma) + math.exp(-36 * gamma) + math.exp(-16 * gamma)) / 4
    assert mmd2_rbf_median(real, gen) == pytest.approx(2 * within - 2 * cross, rel=1e-12)


def test_mmd2_is_clearly_positive_for_separated_sets_and_uses_at_most_100_cells() -> None:
    x = _cells(150, 10, 0)
    far = _cells(150, 10, 1, shift=6.0)
    assert mmd2_rbf_median(x, far) > 0.5
    assert mmd2_rbf_median(x, _cells(150, 10, 2)) < 0.05
    # 150 cells a side are cut to 100 before anything else; all of them give another value.
    assert mmd2_rbf_median(x, far) != mmd2_rbf_median(x, far, max_cells=None)
    assert mmd2_rbf_median(x, far) == mmd2_rbf_median(x, far)  # seeded


def test_bad_input_errors_name_the_problem() -> None:
    real, gen = _pair()
    with pytest.raises(ValueError, match=r"real perturbation column 'target' .* \['gene'\]"):
        compute_st3_metrics(real, gen, real_key="target")
    with pytest.raises(ValueError, match="real has 12 genes and generated 11"):
        compute_st3_metrics(real, gen[:, :11])
    with pytest.raises(ValueError, match=r"no perturbation label is in both real obs\['gene'\]"):
        compute_st3_metrics(_adata(_cells(4, 12, 0), "gene", ["x"] * 4, "r"), gen)
    with pytest.raises(ValueError, match="none of the 1 shared perturbations has >= 2"):
        compute_st3_metrics(_adata(_cells(4, 12, 0), "gene", ["KO_C"] * 4, "r"), gen)
    with pytest.raises(ValueError, match="real needs >= 2 cells, got 1"):
        sliced_w2(np.ones((1, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="`projections` must be >= 1, got 0"):
        sliced_w2(np.ones((3, 3)), np.ones((4, 3)), projections=0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        sliced_w2(np.full((3, 3), np.nan), np.ones((4, 3)))


def _evaluate_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers())
    args = parser.parse_args(["evaluate", *argv])
    return args.func(args)


def _write_counts(path: Path, adata: ad.AnnData) -> Path:
    adata = adata.copy()
    adata.X = np.asarray(adata.X).astype(np.int64)
    adata.write_h5ad(path)
    return path


def test_evaluate_writes_st3_files_and_notes_the_noisy_mmd(tmp_path: Path, capsys) -> None:
    real, gen = _pair()
    real_path = _write_counts(tmp_path / "real.h5ad", real)
    # The generated file lists its genes in another order: evaluate matches them by name.
    gen_path = _write_counts(tmp_path / "gen.h5ad", gen[:, ::-1])
    out = tmp_path / "eval"
    code = _evaluate_cli(
        *("--real", str(real_path), "--generated", str(gen_path), "--out-dir", str(out)),
        *("--condition-key", "perturbation", "--real-condition-key", "gene"),
        *("--n-pcs", "5", "--st3-metrics"),
    )
    assert code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "st3's mmd2_rbf uses at most 100 cells a side per perturbation" in printed
    assert "skipped 1 perturbation(s)" in printed
    for name in (PER_PERTURBATION_JSON, PER_PERTURBATION_CSV, AGGREGATE_JSON, "metrics.json"):
        assert (out / name).is_file()
    # The same numbers as the library call on the name-aligned cells.
    expected = compute_st3_metrics(real, gen)
    assert json.loads((out / PER_PERTURBATION_JSON).read_text()) == expected.per_perturbation
    assert json.loads((out / AGGREGATE_JSON).read_text()) == expected.aggregate


def test_evaluate_st3_metrics_needs_a_condition_column(tmp_path: Path) -> None:
    x = _cells(10, 12, 0)
    real_path = _write_counts(tmp_path / "real.h5ad", _adata(x, "gene", ["a"] * 10, "r"))
    gen_path = _write_counts(tmp_path / "gen.h5ad", _adata(x, "perturbation", ["a"] * 10, "g"))
    with pytest.raises(ValueError, match="--st3-metrics needs a perturbation column"):
        _evaluate_cli("--real", str(real_path), "--generated", str(gen_path), "--st3-metrics")
    assert not (tmp_path / "gen_eval").exists()  # refused before any work


def test_sparse_x_gives_the_same_records_as_dense() -> None:
    real, gen = _pair()
    sparse_real, sparse_gen = real.copy(), gen.copy()
    sparse_real.X = sp.csr_matrix(real.X)
    sparse_gen.X = sp.csr_matrix(gen.X)
    dense = compute_st3_metrics(real, gen)
    assert compute_st3_metrics(sparse_real, sparse_gen).per_perturbation == dense.per_perturbation
