"""Our perturbation network reproduces aivc-dcm's separate-FiLM model and st3's cell-type family
on their own checkpoints (tests/data/upstream, made by scripts/make_upstream_fixtures.py).

The fixtures' weights are drawn wide, so their log-scores are O(1) to O(10) and move by more
than 0.1 with each conditioning input: a 1e-4 match cannot come from a model that drops one.
"""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_files import UPSTREAM, load_io

from sedd.models.st3 import SEDDPerturbationTransformer, SeparateFiLMNorm

pytestmark = pytest.mark.usefixtures("fp32_no_grad")
ATOL = 1e-4
# st3's cell-type family names three weights its own way (sedd.checkpoints.st3 renames them)
CELL_TYPE_NAMES = {
    "celltype_embed.": "cell_type_embed.",
    "celltype_proj.": "cell_type_proj.",
    "precomputed_pert_proj.": "precomputed_proj.",
}


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return load_io(UPSTREAM)


def _state(name: str) -> dict[str, torch.Tensor]:
    state = torch.load(UPSTREAM / name / "final.pt", weights_only=True)["model_state_dict"]
    renamed = {}
    for key, value in state.items():
        for old, new in CELL_TYPE_NAMES.items():
            key = new + key.removeprefix(old) if key.startswith(old) else key
        renamed[key] = value
    return renamed


def _model(name: str) -> SEDDPerturbationTransformer:
    """The fixture's network built from its args.json, holding its weights."""
    args = json.loads((UPSTREAM / name / "args.json").read_text())
    state = _state(name)
    vectors = state.get("precomputed_proj.weight")
    film = "SeparateFiLM" in args.get("model_name", "")
    model = SEDDPerturbationTransformer(
        args["num_genes"],
        args["num_bins"],
        args["num_perturbations"],
        hidden_dim=args["hidden_dim"],
        num_layers=args["num_layers"],
        num_heads=args["num_heads"],
        precomputed_emb_dim=None if vectors is None else vectors.shape[1],
        num_cell_types=args["num_cell_types"] or None,
        conditioning="separate_film" if film else "sum",
        cell_types_required="model_size" in args,
    )
    model.load_state_dict(state, strict=True)
    return model.eval()


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=ATOL)


def test_separate_film_matches_dcm_with_and_without_a_cell_type(io: dict[str, torch.Tensor]):
    model = _model("dcm_film_ct")
    scores = model.score(io["x"], io["sigma"], io["pert_labels"], io["cell_type_labels"])
    _close(scores, io["dcm_film_ct_score"])
    # no cell type: DCM skips the cell-type FiLM, and so do we
    _close(model.score(io["x"], io["sigma"], io["pert_labels"]), io["dcm_film_ct_score_no_ct"])


def test_separate_film_with_perturbation_vectors_matches_dcm(io: dict[str, torch.Tensor]):
    model = _model("dcm_film_vec")
    _close(model.score(io["x"], io["sigma"], io["pert_vec"]), io["dcm_film_vec_score"])


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("st3_celltype", "pert_labels"),
        ("st3_celltype_vec", "pert_vec"),
        ("dcm_pert", "pert_labels"),
    ],
)
def test_summed_relatives_match_upstream(name: str, labels: str, io: dict[str, torch.Tensor]):
    model = _model(name)
    scores = model.score(io["x"], io["sigma"], io[labels], io["cell_type_labels"])
    _close(scores, io[f"{name}_score"])


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("dcm_film_ct", "pert_labels"),
        ("dcm_film_vec", "pert_vec"),
        ("dcm_pert", "pert_labels"),
        ("st3_celltype", "pert_labels"),
        ("st3_celltype_vec", "pert_vec"),
    ],
)
def test_fixture_outputs_depend_on_time_perturbation_and_cell_type(
    name: str, labels: str, io: dict[str, torch.Tensor]
):
    """Parity is meaningful: each input moves the upstream log-scores by far more than ATOL."""
    model = _model(name)
    expected = io[f"{name}_score"]
    cell_types = io["cell_type_labels"] if model.cell_type_embed is not None else None
    label_values = io[labels]
    assert (expected - expected.mean(-1, keepdim=True)).abs().max() > 1.0  # far from uniform
    moved = {
        "sigma": model.score(io["x"], io["sigma"].flip(0), label_values, cell_types),
        "labels": model.score(io["x"], io["sigma"], label_values.roll(1, 0), cell_types),
    }
    if cell_types is not None:
        moved["cell_types"] = model.score(io["x"], io["sigma"], label_values, cell_types.roll(1))
    for what, scores in moved.items():
        assert (scores - expected).abs().max() > 0.1, what
    if f"{name}_score_no_ct" in io:  # upstream's own outputs, with and without a cell type
        assert (io[f"{name}_score_no_ct"] - expected).abs().max() > 0.1


def test_separate_film_keeps_dcm_weight_names():
    model = _model("dcm_film_ct")
    assert set(model.state_dict()) == set(_state("dcm_film_ct"))
    norm = model.blocks[0].attn_norm
    assert isinstance(norm, SeparateFiLMNorm) and norm.cell_type_gamma_beta is not None
    assert not any("attn_norm.gamma_beta" in key for key in model.state_dict())


def test_separate_film_applies_one_film_per_signal_in_turn():
    torch.manual_seed(0)
    norm = SeparateFiLMNorm(8, cell_types=True)
    x, c = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    expected = torch.nn.functional.layer_norm(x, (8,))
    films = (norm.time_gamma_beta, norm.pert_gamma_beta, norm.cell_type_gamma_beta)
    for film, signal in zip(films, c.unbind(1), strict=True):
        gamma, beta = film(signal).chunk(2, dim=-1)
        expected = gamma[:, None] * expected + beta[:, None]
    torch.testing.assert_close(norm(x, c), expected)


def test_cell_type_family_refuses_rows_without_a_cell_type(io: dict[str, torch.Tensor]):
    model = _model("st3_celltype")
    with pytest.raises(ValueError, match=r"`cell_types` is required by this model"):
        model(io["x"], io["sigma"], io["pert_labels"])


def test_unknown_conditioning_and_required_cell_types_without_any_are_refused():
    with pytest.raises(ValueError, match=r"`conditioning` must be 'sum' or 'separate_film'"):
        SEDDPerturbationTransformer(8, 4, 2, hidden_dim=8, conditioning="product")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`cell_types_required` needs `num_cell_types`"):
        SEDDPerturbationTransformer(8, 4, 2, hidden_dim=8, cell_types_required=True)
