"""One vocabulary: a cell-type model is described as one (its card, /v1/models, errors), and a
perturbation model keeps its perturbations and control; /v1/models/{id} is OpenAI-style."""

from __future__ import annotations

import pytest
from server_client import make_settings, served

import sedd
from sedd.checkpoints import model_card
from sedd.defaults import DEFAULT_MODEL


@pytest.mark.anyio
async def test_the_bundled_cell_type_model_says_nothing_of_perturbations(
    bundled_model: sedd.Model,
) -> None:
    async with served(make_settings(DEFAULT_MODEL)) as (client, _):
        listed = (await client.get("/v1/models")).json()["data"][0]
        one = await client.get(f"/v1/models/{listed['id']}")
        missing = await client.get("/v1/models/gpt-4")
        unknown = await client.post("/generate", json={"condition": "CD19 B", "steps": 1})
    assert listed["label_kind"] == "cell_type" and listed["label_key"] == "bulk_labels"
    assert "CD19+ B" in listed["conditions"] and listed["default_condition"] == "Dendritic"
    assert listed["perturbations"] is None and listed["control_label"] is None
    assert one.status_code == 200 and one.json() == listed
    assert missing.status_code == 404 and "this server serves 'pbmc_default'" in missing.text
    [error] = unknown.json()["detail"]
    assert error["type"] == "unknown_condition" and error["loc"] == ["body", "condition"]
    assert error["msg"].startswith("unknown condition 'CD19 B'; did you mean 'CD19+ B'")
    model = bundled_model
    with pytest.raises(ValueError, match=r"^unknown condition 'CD19 B'"):
        model.generate(1, condition="CD19 B", steps=1)
    card = model_card(model.loaded)
    rows = [line.split("  ")[0] for line in card.splitlines()]  # the card's row names
    assert "conditions" in rows and "default condition" in rows
    assert "perturbations" not in rows and "control label" not in rows
