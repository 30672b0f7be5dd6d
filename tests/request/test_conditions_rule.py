"""One rule says whether a model is conditional and on which names, for every front door:
``LoadedModel.conditional`` / ``LoadedModel.conditions``. A model whose names come only from a
vectors file (st3's protein embeddings) is conditional everywhere, not only in the API."""

from __future__ import annotations

import warnings

import pytest
import torch
from checkpoint_files import ST3
from engine_models import request_of

from sedd.api import Model
from sedd.checkpoints import load_checkpoint
from sedd.precision import PrecisionPolicy
from sedd.request.plan import plan
from server.errors import FieldError
from server.names import one_condition

FP32 = PrecisionPolicy(device=torch.device("cpu"), amp_dtype=None)


def test_a_model_with_names_only_in_its_vectors_is_conditional_on_every_path():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # positional genes
        loaded = load_checkpoint(ST3 / "tiny_pert_ct_esm")
    names = list(loaded.perturbation_vectors or {})
    assert loaded.config.perturbations is None and len(names) >= 2
    assert loaded.conditional and loaded.conditions == names
    assert Model(loaded, FP32).conditions == names  # the Python API
    assert one_condition(loaded, names[1]) == (names[1],)  # the server takes a condition
    with pytest.raises(ValueError, match=r"conditioned on perturbations: pass `conditions`"):
        plan(loaded, request_of(cells_per_condition=1))
    cells = plan(loaded, request_of(cells_per_condition=2, conditions=tuple(names))).cells
    assert list(cells["condition"]) == [n for n in names for _ in range(2)]


def test_an_unconditional_model_has_no_conditions_anywhere():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_checkpoint(ST3 / "tiny_mlm")
    assert not loaded.conditional and loaded.conditions == []
    assert Model(loaded, FP32).conditions == []
    assert one_condition(loaded, None) is None
    with pytest.raises(FieldError):
        one_condition(loaded, "KRAS")
