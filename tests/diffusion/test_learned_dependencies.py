"""Training learns a gene-gene dependency, and only the multi-step sampler reproduces it.

Synthetic cells with one hidden on/off state z per cell: genes 0..5 are Poisson(8) when z is on
and Poisson(0.5) when off, so they are strongly correlated (about 0.9); genes 6..11 are
independent Poisson(2). One-shot sampling (one step from the all-mask prediction, as st3 does)
draws every gene from its marginal, so it cannot reproduce the correlation whatever the model
learned. The Euler sampler unmasks a few genes per step and conditions on them.
"""

from __future__ import annotations

from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import torch
from devices import EMULATED
from engine_models import request_of

from sedd.checkpoints import load_checkpoint
from sedd.engine import EngineSettings
from sedd.precision import resolve_precision
from sedd.request.plan import GenerationRequest, plan
from sedd.run import GenerationResult, run_plan
from sedd.train.config import TrainConfig
from sedd.train.trainer import Trainer


def generate(loaded, request: GenerationRequest, precision, **kw) -> GenerationResult:
    """The request alone, offline: the library's one plan, run on an in-process engine."""
    return run_plan(plan(loaded, request), precision, **kw)


N_CELLS, MODULE, OTHER = 800, 6, 6


def _module_cells(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    on = rng.random(N_CELLS) < 0.5  # (N,)
    counts = np.concatenate(
        [
            rng.poisson(np.where(on, 8.0, 0.5)[:, None], (N_CELLS, MODULE)),
            rng.poisson(2.0, (N_CELLS, OTHER)),
        ],
        axis=1,
    )  # (N, G)
    obs = pd.DataFrame(
        {"split": np.where(np.arange(N_CELLS) % 8 == 0, "test", "train")},
        index=[f"cell{i}" for i in range(N_CELLS)],
    )
    var = pd.DataFrame(index=[f"gene{i}" for i in range(MODULE + OTHER)])
    anndata.AnnData(X=counts.astype(np.float32), obs=obs, var=var).write_h5ad(path)
    return counts


def _module_correlation(counts: np.ndarray) -> float:
    """Mean correlation over pairs of module genes."""
    corr = np.corrcoef(counts[:, :MODULE].T.astype(np.float64))  # (MODULE, MODULE)
    return float(corr[np.triu_indices(MODULE, 1)].mean())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("module_cells")
    real = _module_cells(root / "cells.h5ad")
    config = TrainConfig.model_validate(
        {
            "data": str(root / "cells.h5ad"),
            "condition_key": None,
            "arch": {"hidden_dim": 32, "num_layers": 2, "num_heads": 2, "dropout": 0.0},
            "batch_size": 16,
            "max_steps": 300,
            "warmup_steps": 20,
            "schedule": "constant",
            "checkpoint_every": 300,
            "log_every": 100,
            "out": str(root / "model"),
            "run_dir": str(root / "state"),
            # the emulated CUDA lane emulates sampling, not training (no CUDA generators)
            **({"device": "cpu"} if EMULATED else {}),
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only add overhead
    try:
        Trainer(config, progress=False).fit()
    finally:
        torch.set_num_threads(threads)  # the rest of the session keeps its threads
    return load_checkpoint(root / "model"), real


def _sample(loaded, steps: int) -> np.ndarray:
    request = request_of(cells_per_condition=400, steps=steps, seed=0)
    precision, settings = resolve_precision("fp32", loaded.device), EngineSettings(batch_size=400)
    counts = generate(loaded, request, precision, settings=settings).counts
    return np.asarray(counts.toarray() if hasattr(counts, "toarray") else counts)


def test_euler_reproduces_a_learned_module_and_one_shot_does_not(trained):
    loaded, real = trained
    real_corr = _module_correlation(real)
    ours = _module_correlation(_sample(loaded, steps=50))
    one_shot = _module_correlation(_sample(loaded, steps=1))
    print(f"module correlation: real {real_corr:.3f}, 50-step {ours:.3f}, one-shot {one_shot:.3f}")
    assert real_corr > 0.7
    assert ours > 0.6, f"50-step Euler module correlation {ours:.3f} (real {real_corr:.3f})"
    assert abs(one_shot) < 0.15, f"one-shot module correlation {one_shot:.3f}"
