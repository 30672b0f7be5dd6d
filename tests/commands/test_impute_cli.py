"""``sedd impute --data`` on real cells of the bundled model: genes matched by name, unknown
genes reported and dropped, every model gene returned, the given counts kept."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from sedd.cli import main
from sedd.defaults import BUNDLED_DATA


def test_impute_723_known_and_2_unknown_genes_returns_all_765(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = ad.read_h5ad(BUNDLED_DATA)
    known = list(real.var_names[::-1][:723])  # another order than the model's
    given = sp.csr_matrix(real[:3, known].X)
    counts = sp.hstack([given, sp.csr_matrix(np.full((3, 2), 4))]).tocsr()
    genes = [*known, "NOT_A_GENE", "ALSO_NOT"]
    query = ad.AnnData(
        counts, obs=pd.DataFrame(index=["a", "b", "c"]), var=pd.DataFrame(index=genes)
    )
    query.write_h5ad(tmp_path / "Q.h5ad")

    argv = ["impute", "--data", str(tmp_path / "Q.h5ad"), "--steps", "5", "--seed", "0"]
    assert main([*argv, "--precision", "fp32", "--out", str(tmp_path / "O.h5ad")]) == 0
    err = capsys.readouterr().err
    assert "2 gene(s) of the data are not in the model and were dropped" in err

    out = ad.read_h5ad(tmp_path / "O.h5ad")
    assert out.shape == (3, 765) and list(out.obs_names) == ["a", "b", "c"]
    assert list(out.var_names) == list(real.var_names)  # the model's genes, in its order
    x = out.X.toarray() if sp.issparse(out.X) else np.asarray(out.X)
    np.testing.assert_array_equal(x[:, out.var_names.get_indexer(known)], given.toarray())
    assert int(out.var["observed"].sum()) == 723
    assert list(out.uns["sedd"]["imputation"]["dropped_genes"]) == ["NOT_A_GENE", "ALSO_NOT"]
    unobserved = x[:, ~out.var["observed"].to_numpy()]
    assert unobserved.shape == (3, 42) and unobserved.min() >= 0
