"""cell-eval's family, by the cell-eval library, on the report's own cells of a SEMI-SYNTHETIC
planted screen: told the scale (log1p-CP10k), it scores the redraw near the split-half ceiling
and above the cell-mean baseline. Skipped without cell-eval (pip install -e '.[eval]')."""

from __future__ import annotations

import pytest
from planted_screens import small_screen

from sedd.eval.gene_metrics import log_normalize
from sedd.eval.perturbation import PerturbationOptions, evaluate_perturbations
from sedd.eval.planted_screen import CONTROL_LABEL

pytest.importorskip("cell_eval")
pytestmark = [pytest.mark.celleval, pytest.mark.slow]


def test_cell_eval_family_ranks_redraw_and_ceiling_above_the_baseline(tmp_path):
    from sedd.eval.perturbation_celleval import cell_eval_metrics

    screen = small_screen(cells=40, n_control=60)
    report = evaluate_perturbations(
        screen.real.counts,
        screen.real.labels,
        screen.redraw.counts,
        screen.redraw.labels,
        screen.genes,
        PerturbationOptions(CONTROL_LABEL),
        pca_fit_counts=screen.train.counts,
    )
    scored = cell_eval_metrics(
        report,
        log_normalize(screen.real.counts),
        log_normalize(screen.redraw.counts),
        screen.real.labels,
        screen.genes,
        tmp_path,
    )
    assert scored["scale"] == "log1p_cp10k" and scored["is_log1p_passed"] is True
    assert scored["unavailable"] == {"mae_log2fc_sig": "not in this cell-eval's metric registry"}
    summary = scored["summary"]
    for metric in ("pearson_delta", "pr_auc", "de_spearman_lfc_sig"):
        model, ceiling, baseline = (
            summary[metric][m]["mean"]
            for m in ("model", "split_half_ceiling", "cell_mean_baseline")
        )
        assert model > baseline and ceiling > baseline, (metric, model, ceiling, baseline)
    assert summary["mae"]["model"]["mean"] < summary["mae"]["cell_mean_baseline"]["mean"]
    assert summary["discrimination_score_l1"]["model"]["n"] == 4
