"""Generated-cell quality metrics: known values on Gaussians, and the real use on counts."""

from __future__ import annotations

import argparse
import json

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from sedd.commands import evaluate
from sedd.eval.distances import energy_distance, frechet_distance, knn_auc, mmd2_unbiased
from sedd.eval.gene_metrics import correlation_error, log_normalize
from sedd.eval.label_mix import compare_label_mixes
from sedd.eval.metrics import evaluate_counts

N_GENES = 40
GENES = [f"gene{i}" for i in range(N_GENES)]
# Three latent programs shared by every sample: they give the genes a correlation structure.
LOADINGS = np.random.default_rng(123).normal(size=(3, N_GENES)) * 0.7
LOG_BASE = np.random.default_rng(124).uniform(-1.0, 1.5, size=N_GENES)
# A second condition: half the genes up e-fold. (A shift of every gene would only change the
# library size, which normalisation to 1e4 removes.)
STIM_SHIFT = np.r_[np.full(N_GENES // 2, 1.0), np.zeros(N_GENES - N_GENES // 2)]


def latent_counts(n_cells: int, seed: int, shift: float | np.ndarray = 0.0) -> np.ndarray:
    """Poisson counts with log-rate base + shift + z @ loadings, z ~ N(0, I_3) per cell."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n_cells, 3))
    return rng.poisson(np.exp(LOG_BASE + shift + z @ LOADINGS))


def shuffle_genes(counts: np.ndarray, seed: int) -> np.ndarray:
    """Each gene's column permuted independently: same marginals, no gene-gene structure
    (what one-shot sampling of every gene from the all-mask prediction produces)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(column) for column in counts.T], axis=1)


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    # These matrices are tiny: BLAS threads only add overhead, and on a loaded machine a
    # spinning multi-threaded OpenBLAS makes a 300 x 40 SVD take 0.3 s instead of 1 ms.
    with threadpool_limits(limits=1):
        yield


def gaussian(n: int, seed: int, dim: int = 5, mean: float | np.ndarray = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)) + mean


def test_mmd2_is_near_zero_for_one_distribution_and_positive_for_shifted_means():
    x, y = gaussian(200, 0), gaussian(200, 1)
    assert abs(mmd2_unbiased(x, y)) < 0.01
    assert mmd2_unbiased(x, y + 1.0) > 0.3


def test_mmd2_unbiased_drops_the_diagonal_so_identical_sets_score_below_zero():
    x = gaussian(50, 2)
    # x = y, one bandwidth: MMD^2 = 2 mean_{i!=j} k_ij - 2 mean_{i,j} k_ij, and the full mean
    # holds the diagonal k_ii = 1 >= every k_ij, so the value is exact and strictly negative.
    kernel = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1) / 2.0)  # (50, 50)
    off_diag = (kernel.sum() - 50) / (50 * 49)
    value = mmd2_unbiased(x, x.copy(), bandwidths=[1.0])
    assert value == pytest.approx(2 * off_diag - 2 * kernel.mean(), rel=1e-12)
    assert value < 0


def test_energy_distance_is_zero_for_identical_sets_and_positive_when_shifted():
    x = gaussian(150, 3)
    assert energy_distance(x, x.copy()) == 0.0
    assert energy_distance(x, gaussian(150, 4)) < 0.1
    assert energy_distance(x, gaussian(150, 4) + 1.0) > 1.0


def test_frechet_distance_between_unit_gaussians_is_squared_mean_shift():
    mu = np.array([1.0, -1.0, 0.5, 0.0, 1.5])  # |mu|^2 = 4.5
    value = frechet_distance(gaussian(3000, 5), gaussian(3000, 6, mean=mu))
    assert value == pytest.approx(mu @ mu, abs=0.25)
    assert frechet_distance(gaussian(3000, 5), gaussian(3000, 7)) < 0.05


def test_knn_auc_is_half_for_one_distribution_and_near_one_when_separated():
    for seed in range(3):
        x, y = gaussian(300, 10 + seed), gaussian(300, 20 + seed)
        assert knn_auc(x, y, seed=seed) == pytest.approx(0.5, abs=0.1)
    assert knn_auc(gaussian(300, 8), gaussian(300, 9) + 3.0, seed=0) > 0.9


def test_knn_auc_balances_the_classes_and_is_reproducible():
    x, y = gaussian(400, 11), gaussian(60, 12) + 0.5
    assert knn_auc(x, y, seed=3) == knn_auc(x, y, seed=3)
    with pytest.raises(ValueError, match="n >= 5"):
        knn_auc(x, y[:4])


def test_correlation_error_is_zero_for_identical_data_and_large_for_independent_genes():
    correlated = np.log1p(latent_counts(500, 0).astype(float))
    error = correlation_error(correlated, correlated.copy())
    assert error["rms"] == 0.0 and error["mean_abs"] == 0.0
    same_structure = correlation_error(correlated, np.log1p(latent_counts(500, 1).astype(float)))
    independent = correlation_error(correlated, shuffle_genes(correlated, 0))
    assert same_structure["rms"] < 0.1
    assert independent["rms"] > 2 * same_structure["rms"]
    assert independent["mean_abs"] > 2 * same_structure["mean_abs"]
    assert independent["n_genes"] == N_GENES  # top_k = 100 > 40 genes: all of them


def test_evaluate_counts_ranks_matching_samples_above_gene_shuffled_samples():
    real = latent_counts(300, 0)
    matching = evaluate_counts(real, latent_counts(300, 1), GENES, n_pcs=10)["overall"]
    shuffled = evaluate_counts(real, shuffle_genes(latent_counts(300, 2), 0), GENES, n_pcs=10)
    shuffled = shuffled["overall"]
    assert matching["n_pcs"] == shuffled["n_pcs"] == 10
    assert matching["mmd2_rbf"] < 0.02 < 0.1 < shuffled["mmd2_rbf"]
    assert matching["energy_distance"] < shuffled["energy_distance"] / 3
    assert matching["frechet_distance"] < shuffled["frechet_distance"] / 3
    assert matching["corr_rms"] < shuffled["corr_rms"] / 2
    assert abs(matching["knn_auc"] - 0.5) < 0.1
    assert shuffled["knn_auc"] > 0.85
    # Shuffling keeps each gene's marginal, so the per-gene metrics cannot tell them apart.
    assert matching["gene_mean_pearson"] > 0.95 and shuffled["gene_mean_pearson"] > 0.95
    assert shuffled["zero_fraction_gene_mae"] < 0.05


def test_evaluate_counts_simple_metrics_have_their_defined_values():
    real = np.array([[0, 2, 0], [1, 0, 0], [3, 1, 0], [0, 0, 2], [4, 4, 0]])
    gen = np.array([[1, 1, 0], [0, 0, 1], [2, 2, 2], [0, 5, 0], [1, 0, 0], [0, 0, 0]])
    overall = evaluate_counts(real, gen, ["a", "b", "c"])["overall"]
    assert overall["zero_fraction_real"] == pytest.approx(8 / 15)
    assert overall["zero_fraction_gen"] == pytest.approx(10 / 18)
    # per-gene zero fractions: real (2/5, 2/5, 4/5), generated (3/6, 3/6, 4/6)
    assert overall["zero_fraction_gene_mae"] == pytest.approx((0.1 + 0.1 + 2 / 15) / 3)
    assert overall["library_size_mean_real"] == pytest.approx(17 / 5)
    assert overall["library_size_median_gen"] == pytest.approx(1.5)  # totals 0 1 1 2 5 6
    assert overall["n_pcs"] == 3  # min(50, 5 - 1, 3 genes)


def test_evaluate_counts_reports_each_condition_and_skips_unmatched_or_tiny_ones():
    real = np.vstack(
        [latent_counts(120, 0), latent_counts(120, 1, shift=STIM_SHIFT), latent_counts(30, 2)]
    )
    real_labels = ["A"] * 120 + ["B"] * 120 + ["only_real"] * 30
    gen = np.vstack(
        [latent_counts(100, 3), latent_counts(100, 4, shift=STIM_SHIFT), latent_counts(3, 5)]
    )
    gen_labels = ["A"] * 100 + ["B"] * 100 + ["tiny"] * 3
    real = np.vstack([real, latent_counts(4, 6)])
    real_labels += ["tiny"] * 4
    result = evaluate_counts(
        real, gen, GENES, real_conditions=real_labels, gen_conditions=gen_labels, n_pcs=10
    )
    per = result["per_condition"]
    assert set(per) == {"A", "B", "only_real", "tiny"}
    assert per["A"]["n_real"] == 120 and per["A"]["n_gen"] == 100
    assert per["A"]["mmd2_rbf"] < 0.05 and per["B"]["mmd2_rbf"] < 0.05
    assert per["only_real"] == {"n_real": 30, "n_gen": 0, "skipped": "only in the real set"}
    assert per["tiny"]["n_real"] == 4 and per["tiny"]["n_gen"] == 3
    assert "counts only" in per["tiny"]["skipped"] and "mmd2_rbf" not in per["tiny"]
    # Overall: only the cells of conditions in both sets (A, B, tiny).
    assert result["overall"]["n_real"] == 244 and result["overall"]["n_gen"] == 203

    # Swapped labels compare A with B: the per-condition metrics must notice.
    swapped = evaluate_counts(
        real,
        gen,
        GENES,
        real_conditions=real_labels,
        gen_conditions=[{"A": "B", "B": "A"}.get(c, c) for c in gen_labels],
        n_pcs=10,
    )["per_condition"]
    assert swapped["A"]["mmd2_rbf"] > 10 * per["A"]["mmd2_rbf"]
    assert swapped["A"]["knn_auc"] > per["A"]["knn_auc"] + 0.2


def test_evaluate_counts_rejects_non_integer_counts():
    logged = np.log1p(latent_counts(20, 0).astype(float))
    with pytest.raises(ValueError, match="raw UMI counts"):
        evaluate_counts(latent_counts(20, 1), logged, GENES)


def test_evaluate_counts_fits_pca_on_separate_real_cells_when_given():
    real, gen = latent_counts(60, 0), latent_counts(60, 1)
    result = evaluate_counts(real, gen, GENES, n_pcs=30, pca_fit_counts=latent_counts(200, 2))
    assert result["overall"]["n_pcs"] == 30
    assert result["params"]["pca_fit"].startswith("200 separate real cells")


def _write_h5ad(path, counts, genes, obs):
    ad.AnnData(
        X=counts.astype(np.int64),
        obs=pd.DataFrame(obs, index=[f"{path.stem}{i}" for i in range(len(counts))]),
        var=pd.DataFrame(index=genes),
    ).write_h5ad(path)


def _evaluate_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers())
    args = parser.parse_args(["evaluate", *argv])
    return args.func(args)


def test_cli_writes_metrics_json_and_three_plots(tmp_path):
    real = np.vstack([latent_counts(60, 0), latent_counts(60, 1, shift=STIM_SHIFT)])
    labels = ["ctrl"] * 60 + ["stim"] * 60
    split = ["test" if i % 2 else "train" for i in range(120)]
    _write_h5ad(tmp_path / "real.h5ad", real, GENES, {"perturbation": labels, "split": split})
    gen = np.vstack([latent_counts(40, 2), latent_counts(40, 3, shift=STIM_SHIFT)])
    # The generated file lacks the last gene: genes are matched by name.
    _write_h5ad(tmp_path / "gen.h5ad", gen[:, :-1], GENES[:-1], {"perturbation": labels[20:100]})

    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "evaluate",
            *("--real", str(tmp_path / "real.h5ad"), "--generated", str(tmp_path / "gen.h5ad")),
            *("--out-dir", str(tmp_path / "eval"), "--split-value", "test", "--n-pcs", "10"),
        ]
    )
    assert args.func(args) == 0

    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"inputs", "scale", "overall", "per_condition", "params", "label_mix"}
    assert metrics["scale"]["input"] == "counts"  # stated, so no reader guesses
    assert metrics["scale"]["gene_means_correlations_and_pcs"] == "log1p_cp10k"
    assert metrics["label_mix"]["real"] == {"ctrl": 30, "stim": 30}
    assert metrics["label_mix"]["total_variation"] == 0.0 and metrics["label_mix"]["matched"]
    assert metrics["inputs"]["genes_shared"] == N_GENES - 1
    assert metrics["inputs"]["real_cells_used"] == 60
    assert metrics["inputs"]["condition_key_real"] == "perturbation"
    assert set(metrics["per_condition"]) == {"ctrl", "stim"}
    assert metrics["overall"]["n_real"] == 60 and metrics["overall"]["n_gen"] == 80
    for name in ("mmd2_rbf", "energy_distance", "frechet_distance", "knn_auc", "corr_rms"):
        assert isinstance(metrics["overall"][name], float)
    for png in ("pca_overlay.png", "gene_means.png", "correlation_matrices.png"):
        assert (tmp_path / "eval" / png).stat().st_size > 1000


def test_cli_warns_when_the_label_mixes_differ_and_reports_each_label(tmp_path, capsys):
    real = np.vstack([latent_counts(36, 0), latent_counts(4, 1, shift=STIM_SHIFT)])
    _write_h5ad(tmp_path / "real.h5ad", real, GENES, {"perturbation": ["ctrl"] * 36 + ["stim"] * 4})
    gen = np.vstack([latent_counts(20, 2), latent_counts(20, 3, shift=STIM_SHIFT)])
    _write_h5ad(tmp_path / "gen.h5ad", gen, GENES, {"perturbation": ["ctrl"] * 20 + ["stim"] * 20})
    argv = ["--real", str(tmp_path / "real.h5ad"), "--generated", str(tmp_path / "gen.h5ad")]
    assert _evaluate_cli(*argv, "--out-dir", str(tmp_path / "eval"), "--n-pcs", "5") == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "warning: the label mixes differ (total variation 0.40" in printed
    assert "real: 36 ctrl, 4 stim; generated: 20 ctrl, 20 stim" in printed
    assert "--like <real .h5ad> --condition-key perturbation" in printed
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["label_mix"]["total_variation"] == 0.4 and not metrics["label_mix"]["matched"]
    assert set(metrics["per_condition"]) == {"ctrl", "stim"}  # each label's own figures
    assert metrics["per_condition"]["stim"]["n_real"] == 4


def test_label_mixes_compare_as_proportions():
    same = compare_label_mixes(["a", "a", "b"], ["b", "a", "a", "a", "b", "a"])
    assert same.total_variation == 0.0 and same.matched and same.warning("k", "g") is None
    apart = compare_label_mixes(["a", "a", None, float("nan")], ["b", "a"])
    assert apart.real == {"a": 2} and apart.total_variation == 0.5 and not apart.matched
    with pytest.raises(ValueError, match="labelled cells on both sides"):
        compare_label_mixes([None], ["a"])


def test_cli_errors_name_the_problem(tmp_path):
    counts = latent_counts(30, 0)
    _write_h5ad(tmp_path / "real.h5ad", counts, GENES, {"cell_type": ["x"] * 30})
    missing = tmp_path / "nope.h5ad"
    with pytest.raises(FileNotFoundError, match=r"nope\.h5ad"):
        _evaluate_cli("--real", str(tmp_path / "real.h5ad"), "--generated", str(missing))
    with pytest.raises(ValueError, match=r"available: \['cell_type'\]"):
        _evaluate_cli(
            "--real",
            str(tmp_path / "real.h5ad"),
            "--generated",
            str(tmp_path / "real.h5ad"),
            "--condition-key",
            "perturbation",
        )
    ad.AnnData(X=np.log1p(counts.astype(float)), var=pd.DataFrame(index=GENES)).write_h5ad(
        tmp_path / "logged.h5ad"
    )
    with pytest.raises(ValueError, match="raw UMI counts"):
        _evaluate_cli(
            "--real", str(tmp_path / "real.h5ad"), "--generated", str(tmp_path / "logged.h5ad")
        )
    ad.AnnData(X=counts[:, :1], var=pd.DataFrame(index=["other"])).write_h5ad(tmp_path / "g.h5ad")
    with pytest.raises(ValueError, match="share 0 gene names"):
        _evaluate_cli(
            "--real", str(tmp_path / "real.h5ad"), "--generated", str(tmp_path / "g.h5ad")
        )


def test_log_normalize_accepts_integer_counts():
    out = log_normalize(np.array([[1, 3], [0, 0]], dtype=np.int64))
    np.testing.assert_allclose(out, np.log1p([[2500.0, 7500.0], [0.0, 0.0]]))
