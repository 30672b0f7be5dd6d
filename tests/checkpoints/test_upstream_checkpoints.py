"""aivc-dcm and st3 cell-type experiments load as their trainers left them, picked by what their
args.json and weights say, reproduce the upstream log-scores, convert to native and sample.

Fixtures: tests/data/upstream (scripts/make_upstream_fixtures.py; README.md there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_files import UPSTREAM, copy_tree, load_io

import sedd
from sedd.checkpoints import CheckpointError, LoadedModel, load_checkpoint, save_native

pytestmark = [
    pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL"),
    pytest.mark.usefixtures("fp32_no_grad"),
]

ATOL = 1e-4

FILM, CELL_TYPE = "SEDDPerturbationTransformerSeparateFiLM", "SEDDCellTypePerturbationTransformer"
# fixture -> (upstream class, conditioning, cell types required, the labels it was scored with)
FAMILIES: dict[str, tuple[str, str, bool, str]] = {
    "dcm_film_ct": (f"{FILM}Small", "separate_film", False, "pert_labels"),
    "dcm_film_vec": (FILM, "separate_film", False, "pert_vec"),
    "dcm_pert": ("SEDDPerturbationTransformerMedium", "sum", False, "pert_labels"),
    "st3_celltype": (f"{CELL_TYPE}Small", "sum", True, "pert_labels"),
    "st3_celltype_vec": (f"{CELL_TYPE}Medium", "sum", True, "pert_vec"),
}
PERTURBATIONS = ["non-targeting", "STAT1", "IRF1", "JAK1", "MYC"]
CELL_TYPES = ["B", "Mono", "T"]


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return load_io(UPSTREAM)


def _scores(loaded: LoadedModel, name: str, io: dict[str, torch.Tensor]) -> torch.Tensor:
    cell_types = io["cell_type_labels"] if loaded.config.num_cell_types else None
    labels = io[FAMILIES[name][3]]
    return loaded.model.score(io["x"], io["sigma"], labels, cell_types)


def _experiment(name: str, tmp_path: Path, **args: Any) -> Path:
    """A writable copy of fixture ``name`` with ``args`` changed in its args.json."""
    exp = copy_tree(UPSTREAM / name, tmp_path / name)
    saved = json.loads((exp / "args.json").read_text())
    (exp / "args.json").write_text(json.dumps(saved | args))
    return exp


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_upstream_family_loads_by_its_own_description_and_matches_upstream(
    name: str, io: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    source_class, conditioning, required, _ = FAMILIES[name]
    loaded = sedd.load(UPSTREAM / name, device="cpu").loaded
    config = loaded.config
    assert config.architecture == "st3_perturbation" and loaded.layout == "st3"
    assert config.arch.conditioning == conditioning  # type: ignore[union-attr]
    assert config.arch.cell_types_required is required  # type: ignore[union-attr]
    assert config.provenance.source_class == source_class
    scores = _scores(loaded, name, io)
    torch.testing.assert_close(scores, io[f"{name}_score"], rtol=0.0, atol=ATOL)

    again = load_checkpoint(save_native(loaded, tmp_path / "native"))
    assert again.layout == "native"
    for field in ("arch", "perturbations", "control_label", "cell_types", "provenance"):
        expected = getattr(loaded.config, field)
        if field == "provenance":  # the native files add when they were written
            expected = expected.model_copy(update={"created": again.config.provenance.created})
        assert getattr(again.config, field) == expected, field
    assert torch.equal(_scores(again, name, io), scores)


def test_label_names_come_from_what_each_args_json_stores() -> None:
    dcm = load_checkpoint(UPSTREAM / "dcm_film_ct")  # cell_type_to_idx + st3's names file
    assert dcm.config.cell_types == CELL_TYPES and dcm.config.perturbations == PERTURBATIONS
    vec = load_checkpoint(UPSTREAM / "dcm_film_vec")  # names from its vector file
    assert vec.config.perturbations is None and vec.conditions == PERTURBATIONS
    cell_type_family = load_checkpoint(UPSTREAM / "st3_celltype")  # cell_types, perturbations
    assert cell_type_family.config.cell_types == CELL_TYPES
    assert cell_type_family.config.perturbations == PERTURBATIONS
    assert cell_type_family.config.control_label == "non-targeting"
    assert cell_type_family.cell_type_index("T") == 2 and cell_type_family.label_index("IRF1") == 2


@pytest.mark.parametrize("name", ["dcm_film_ct", "st3_celltype"])
def test_new_families_sample_through_the_engine(name: str) -> None:
    model = sedd.load(UPSTREAM / name, device="cpu")
    cells = model.generate(2, condition=["STAT1", "MYC"], cell_type="Mono", steps=2, seed=0)
    assert cells.shape == (4, 48)
    assert list(cells.obs["cell_type"]) == ["Mono"] * 4
    assert list(cells.obs["perturbation"]) == ["STAT1", "STAT1", "MYC", "MYC"]


def test_cell_type_family_refuses_to_sample_without_a_cell_type() -> None:
    model = sedd.load(UPSTREAM / "st3_celltype", device="cpu")
    with pytest.raises(ValueError, match=r"needs a cell type for every cell"):  # at planning
        model.generate(1, condition="STAT1", steps=2)


def test_an_unknown_model_name_is_refused_naming_it(tmp_path: Path) -> None:
    exp = _experiment("dcm_film_ct", tmp_path, model_name="FooTransformer")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(exp)
    message = str(caught.value)
    assert "asks for model_name 'FooTransformer', which sedd cannot build; known: " in message
    assert "SEDDPerturbationTransformerSeparateFiLM" in message and "\n" not in message


def test_an_unknown_model_size_is_refused_naming_it(tmp_path: Path) -> None:
    exp = _experiment("st3_celltype", tmp_path, model_size="huge")
    with pytest.raises(CheckpointError, match=r"asks for model_size 'huge'.*known: small, medium"):
        load_checkpoint(exp)


def test_the_named_class_decides_not_the_weights(tmp_path: Path) -> None:
    """Separate-FiLM weights under a summed model_name are a mismatch, not a silent switch."""
    exp = _experiment("dcm_film_ct", tmp_path, model_name="SEDDPerturbationTransformerSmall")
    with pytest.raises(CheckpointError, match=r"missing keys.*attn_norm\.gamma_beta"):
        load_checkpoint(exp)


def test_cell_types_given_as_vectors_are_refused(tmp_path: Path) -> None:
    exp = copy_tree(UPSTREAM / "st3_celltype", tmp_path / "exp")
    payload = torch.load(exp / "final.pt", weights_only=True)
    payload["model_state_dict"]["precomputed_celltype_proj.weight"] = torch.zeros(16, 4)
    payload["model_state_dict"]["precomputed_celltype_proj.bias"] = torch.zeros(16)
    torch.save(payload, exp / "final.pt")
    with pytest.raises(CheckpointError, match=r"holds precomputed_celltype_proj.*by index only"):
        load_checkpoint(exp)


def test_a_cell_type_list_of_the_wrong_length_names_the_key(tmp_path: Path) -> None:
    exp = _experiment("st3_celltype", tmp_path, cell_types=["B", "T"])
    with pytest.raises(CheckpointError, match=r"cell_types must list the model's 3 names.*found 2"):
        load_checkpoint(exp)


def test_cell_type_family_refuses_a_request_without_cell_type_at_planning() -> None:
    from sedd.defaults import SamplingOptions
    from sedd.request.plan import GenerationRequest, plan

    loaded = load_checkpoint(UPSTREAM / "st3_celltype")
    request = GenerationRequest(conditions=("STAT1",), cells_per_condition=1,
                                sampling=SamplingOptions(steps=2))  # fmt: skip
    with pytest.raises(ValueError, match=r"needs a cell type for every cell.*'B', 'Mono', 'T'"):
        plan(loaded, request)
    planned = plan(
        loaded,
        GenerationRequest(
            conditions=("STAT1",),
            cells_per_condition=1,
            cell_type="Mono",
            sampling=SamplingOptions(steps=2),
        ),
    )
    assert list(planned.cells["cell_type"]) == ["Mono"]  # fmt: skip


def test_a_list_that_reorders_args_json_perturbations_is_refused(tmp_path: Path) -> None:
    shuffled = tmp_path / "all.txt"
    shuffled.write_text("non-targeting\nIRF1\nSTAT1\nJAK1\nMYC\n")
    with pytest.raises(CheckpointError, match=r"'STAT1' is index 2 there, 1 in training"):
        load_checkpoint(UPSTREAM / "st3_celltype", perturbations=shuffled)
    same = tmp_path / "same.txt"
    same.write_text("\n".join(PERTURBATIONS) + "\n")
    loaded = load_checkpoint(UPSTREAM / "st3_celltype", perturbations=same)
    assert loaded.label_index("IRF1") == 2


def test_the_model_card_names_the_upstream_class() -> None:
    from sedd.checkpoints import model_card

    text = model_card(load_checkpoint(UPSTREAM / "dcm_film_ct"))
    assert "upstream class    SEDDPerturbationTransformerSeparateFiLMSmall" in text
    assert "conditioning=separate_film" in text
