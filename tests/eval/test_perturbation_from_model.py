"""``sedd evaluate --perturbation --model``: the report's generated side drawn from the model
through ``Model.generate``, one cell per held-out real cell (capped), unknown labels skipped."""

from __future__ import annotations

import json
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
from server_models import GENES, save_tiny_model

from sedd.cli import main
from sedd.commands.evaluate_model_cells import UNKNOWN_REASON, label_counts
from sedd.eval.perturbation_plots import most_significant, write_lfc_scatter

# held-out real cells per label; "NOVEL" is a label the tiny model was not trained on
REAL_CELLS = {"ctrl": 12, "KRAS": 10, "TP53": 7, "NOVEL": 6}
MAX_CELLS = 8


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pert_model")
    model = save_tiny_model(root / "tiny")
    rng = np.random.default_rng(0)
    labels = np.repeat(list(REAL_CELLS), list(REAL_CELLS.values()))
    counts = rng.poisson(2.0, size=(len(labels), len(GENES))).astype(np.float32)
    real = ad.AnnData(
        X=counts,
        obs=pd.DataFrame({"perturbation": labels}, index=[f"c{i}" for i in range(len(labels))]),
        var=pd.DataFrame(index=GENES),
    )
    real.write_h5ad(root / "real.h5ad")
    out = root / "report"
    argv = ["evaluate", "--perturbation", "--model", str(model), "--real", str(root / "real.h5ad")]
    argv += ["--control-label", "ctrl", "--steps", "2", "--max-cells", str(MAX_CELLS)]
    argv += ["--n-pcs", "4", "--precision", "fp32", "--device", "cpu", "--out-dir", str(out)]
    assert main(argv) == 0
    return out


def test_label_counts_match_the_real_cells_up_to_the_cap():
    assert label_counts(["a", "b", "a", "a"], 2) == {"a": 2, "b": 1}
    assert label_counts(["a", "b", "a"], None) == {"a": 2, "b": 1}


def test_model_generates_one_cell_per_held_out_cell_capped(run_dir: Path):
    cells = ad.read_h5ad(run_dir / "generated_cells.h5ad")
    made = cells.obs["condition"].astype(str).value_counts().to_dict()
    assert made == {"ctrl": 8, "KRAS": 8, "TP53": 7}
    assert list(cells.var_names) == GENES
    assert cells.uns["sedd"]["steps"] == 2
    assert cells.uns["sedd"]["scale"] == "counts"


def test_unknown_label_is_skipped_and_listed_in_the_summary(run_dir: Path):
    summary = json.loads((run_dir / "summary_metrics.json").read_text())
    assert summary["skipped"]["NOVEL"] == UNKNOWN_REASON
    assert summary["inputs"]["unknown_to_model"] == ["NOVEL"]
    assert summary["n_perturbations"] == 2  # KRAS and TP53 scored
    per_pert = json.loads((run_dir / "per_pert_metrics.json").read_text())
    assert set(per_pert["perturbations"]) == {"KRAS", "TP53"}
    assert per_pert["perturbations"]["KRAS"]["model"]["w2"] > 0.0
    table = json.loads((run_dir / "count_table.json").read_text())
    assert (
        table["scale"] == "counts" and table["statistics"]["gene_mean"]["train_vs_held_out"] is None
    )


def test_lfc_scatter_draws_the_perturbations_with_most_significant_genes(tmp_path: Path):
    def row(pert: str, gene: int, significant: bool) -> dict:
        lfc = float(gene - 2)
        return {"perturbation": pert, "gene": f"g{gene}", "significant": significant,
                "lfc_real": lfc, "lfc_model": 0.5 * lfc, "lfc_cell_mean_baseline": 0.0}  # fmt: skip

    rows = [row("A", g, g < 4) for g in range(5)] + [row("B", g, g < 1) for g in range(5)]
    rows += [row("C", g, g < 3) for g in range(5)]
    assert most_significant(rows, 2) == ["A", "C"]
    path = write_lfc_scatter(rows, tmp_path / "lfc.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert write_lfc_scatter([row("A", 0, False)], tmp_path / "none.png") is None


def test_the_report_needs_generated_cells_or_a_model(tmp_path: Path, capsys):
    argv = ["evaluate", "--perturbation", "--real", str(tmp_path / "real.h5ad")]
    assert main(argv) == 2
    assert "--generated FILE (cells to judge) or --model PATH" in capsys.readouterr().err
