"""A label mix: ``Model.generate(like=...)`` and ``sedd generate --like`` make as many cells of
each label as the given cells have."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
from arrays import dense

import sedd
from sedd.cli import main
from sedd.defaults import BUNDLED_DATA


@pytest.fixture(scope="module")
def model(bundled_model: sedd.Model) -> sedd.Model:
    return bundled_model


@pytest.fixture(scope="module")
def like() -> ad.AnnData:
    data = ad.read_h5ad(BUNDLED_DATA)
    labels = data.obs["bulk_labels"].astype(str)
    picks = [*np.flatnonzero(labels == "CD19+ B")[:3], *np.flatnonzero(labels == "Dendritic")[:1]]
    picks += list(np.flatnonzero(labels == "CD56+ NK")[:2])
    return data[sorted(picks)].copy()


def test_generate_like_matches_the_label_counts(model: sedd.Model, like: ad.AnnData, tmp_path):
    out = model.generate(like=like, steps=2, seed=4)
    want = like.obs["bulk_labels"].astype(str).value_counts().to_dict()
    assert out.obs["bulk_labels"].astype(str).value_counts().to_dict() == want
    assert out.n_obs == like.n_obs == 6
    assert out.uns["sedd"]["request"]["condition_counts"] == [
        want[name] for name in model.conditions if name in want
    ]
    path = tmp_path / "like.h5ad"
    like.write_h5ad(path)
    assert main(["generate", "--like", str(path), "--condition-key", "bulk_labels", "--steps",
                 "2", "--seed", "4", "--precision", "fp32", "--device", "cpu", "--out",
                 str(tmp_path / "cli.h5ad")]) == 0  # fmt: skip
    cli = ad.read_h5ad(tmp_path / "cli.h5ad")
    np.testing.assert_array_equal(dense(cli.X), dense(out.X))
    assert list(cli.obs_names) == list(out.obs_names)


def test_like_errors_name_the_field(model: sedd.Model, like: ad.AnnData):
    with pytest.raises(ValueError, match=r"`condition_key` 'leiden' is not an obs column"):
        model.generate(like=like, condition_key="leiden")
    with pytest.raises(ValueError, match=r"pass `like` or `num_cells`"):
        model.generate(3, like=like)
    with pytest.raises(ValueError, match=r"`num_cells` must be given"):
        model.generate()
