"""Array helpers shared by the tests."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def dense(x: object) -> np.ndarray:
    """A count matrix as a dense array, whether AnnData stored it sparse or dense."""
    return x.toarray() if sp.issparse(x) else np.asarray(x)  # type: ignore[union-attr]
