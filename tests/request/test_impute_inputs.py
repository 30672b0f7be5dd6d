"""Imputation inputs a user can get wrong: each is one line naming the problem, from the API
and from ``sedd impute`` (exit 2), before any sampling."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest

import sedd
from sedd.cli import main


def cells(x: np.ndarray, genes: list[str]) -> ad.AnnData:
    names = [f"c{i}" for i in range(x.shape[0])]
    return ad.AnnData(x, obs=pd.DataFrame(index=names), var=pd.DataFrame(index=genes))


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (np.array([[1e300, 0.0]]), r"^\.X is not counts: 1 stored values are above 2\.147e\+09"),
        (np.array([[1 + 2j, 0]]), r"^\.X holds complex numbers \(dtype complex128\)"),
        (np.zeros((0, 2)), r"^the data has no cells \(0 rows\): nothing to impute"),
    ],
)
def test_bad_counts_are_one_line_errors_in_the_api_and_the_cli(
    bundled_model: sedd.Model,
    x: np.ndarray,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = cells(x, list(bundled_model.genes[:2]))
    with pytest.raises(ValueError, match=message):
        bundled_model.impute(data, steps=1)
    data.write_h5ad(tmp_path / "in.h5ad")
    argv = ["impute", str(tmp_path / "in.h5ad"), "--steps", "1", "--out", str(tmp_path / "o.h5ad")]
    assert main(argv) == 2
    [line] = [x for x in capsys.readouterr().err.splitlines() if " error: " in x]
    assert line.startswith("sedd impute: error: ")
    assert not (tmp_path / "o.h5ad").exists()
