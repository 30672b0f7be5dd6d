"""Names of genes and labels: st3's side files, user-given gene lists, label mappings and
perturbation vectors, for every layout, and the errors bad ones give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from checkpoint_files import (
    REF,
    ST3,
    TouchOnUnpickle,
    gene_file,
    load_io,
)

from sedd.checkpoints import CheckpointError, UnknownLabelError, load_checkpoint, save_native

pytestmark = [
    pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL"),
    pytest.mark.usefixtures("fp32_no_grad"),
]


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return load_io()


# ----------------------------------------------------------------------------------------------
# Names from the checkpoint and its side files
# ----------------------------------------------------------------------------------------------


def test_st3_labels_come_from_the_experiment_side_files(tmp_path: Path) -> None:
    pert = load_checkpoint(ST3 / "tiny_pert")
    assert pert.config.perturbations == ["non-targeting", "GENE_A", "GENE_B", "GENE_C", "GENE_D"]
    assert pert.config.control_label == "non-targeting"
    assert pert.label_index("GENE_C") == 3
    assert pert.perturbation_labels(["GENE_D", "non-targeting"]).tolist() == [4, 0]

    esm = load_checkpoint(ST3 / "tiny_pert_ct_esm")
    assert esm.config.cell_types == ["hepg2", "jurkat", "rpe1"]
    assert esm.cell_type_index("rpe1") == 2
    upstream = torch.load(ST3 / "tiny_pert_ct_esm" / "protein_embeddings.pt", weights_only=True)
    assert torch.equal(esm.perturbation_labels(["GENE_B"])[0], upstream["GENE_B"])

    native = load_checkpoint(save_native(esm, tmp_path / "native"))
    assert native.config.perturbation_vectors
    assert list(native.perturbation_vectors) == list(upstream)
    assert torch.equal(native.perturbation_vectors["GENE_A"], upstream["GENE_A"])


def test_checkpoint_with_optimizer_state_loads_and_warns_about_unnamed_labels() -> None:
    with pytest.warns(UserWarning, match=r"no perturbation names .*--perturbation-map FILE"):
        loaded = load_checkpoint(ST3 / "tiny_pert_2steps")
    assert loaded.config.provenance.step == 2 and loaded.config.perturbations is None
    with pytest.raises(UnknownLabelError, match=r"has no perturbation names.*--perturbation-map"):
        loaded.label_index("GENE_A")


def test_unknown_label_suggests_close_names() -> None:
    pert = load_checkpoint(ST3 / "tiny_pert")
    with pytest.raises(UnknownLabelError, match="did you mean 'GENE_A'") as err:
        pert.label_index("GENE_a")
    assert err.value.name == "GENE_a" and err.value.suggestions[0] == "GENE_A"
    with pytest.raises(UnknownLabelError, match="has no cell type names"):
        pert.cell_type_index("hepg2")


def test_missing_gene_list_warns_and_names_genes_by_position() -> None:
    with pytest.warns(UserWarning, match=r"GENES ARE POSITIONAL: .*--genes FILE"):
        loaded = load_checkpoint(ST3 / "tiny_mlm")
    assert loaded.config.genes[:3] == ["0", "1", "2"] and loaded.config.genes_by_position


# ----------------------------------------------------------------------------------------------
# Side files given by the user
# ----------------------------------------------------------------------------------------------


def test_gene_list_from_h5ad_var_names(tmp_path: Path) -> None:
    import anndata
    import numpy as np
    import pandas as pd

    names = [f"h5gene{i}" for i in range(64)]
    adata = anndata.AnnData(np.zeros((2, 64), dtype=np.float32), var=pd.DataFrame(index=names))
    adata.write_h5ad(tmp_path / "ref.h5ad")
    assert load_checkpoint(ST3 / "tiny_mlm", genes=tmp_path / "ref.h5ad").config.genes == names


def test_json_perturbation_mapping_sets_label_order(tmp_path: Path) -> None:
    mapping = {"ctrl": 0, "B": 2, "A": 1, "D": 4, "C": 3}
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    loaded = load_checkpoint(ST3 / "tiny_pert", perturbations=tmp_path / "map.json")
    assert loaded.config.perturbations == ["ctrl", "A", "B", "C", "D"]
    assert loaded.config.control_label == "ctrl"  # args.json's name is absent: index 0
    assert loaded.label_index("C") == 3


def test_native_model_takes_gene_names_and_resaves_in_place(
    tmp_path: Path, io: dict[str, torch.Tensor]
) -> None:
    native = save_native(load_checkpoint(ST3 / "tiny_pert_ct_esm"), tmp_path / "native")
    loaded = load_checkpoint(native, genes=gene_file(tmp_path))
    save_native(loaded, native)
    again = load_checkpoint(native)
    assert again.config.genes[-1] == "GENE63" and not again.config.genes_by_position
    assert list(again.perturbation_vectors) == list(loaded.perturbation_vectors)
    out = again.model(io["x"], io["sigma"], io["pert_vec"], io["cell_type_labels"])
    expected = loaded.model(io["x"], io["sigma"], io["pert_vec"], io["cell_type_labels"])
    assert torch.equal(out, expected)


# ----------------------------------------------------------------------------------------------
# Bad side files
# ----------------------------------------------------------------------------------------------


def test_pickled_code_in_a_side_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    torch.save({"GENE_A": TouchOnUnpickle(marker)}, tmp_path / "vectors.pt")
    with pytest.raises(CheckpointError, match=r"refused to load .*vectors\.pt"):
        load_checkpoint(ST3 / "tiny_pert_ct_esm", vectors=tmp_path / "vectors.pt")
    assert not marker.exists()


def test_gene_list_of_the_wrong_length(tmp_path: Path) -> None:
    genes = gene_file(tmp_path, n=63)
    with pytest.raises(
        CheckpointError, match=r"genes\.txt has 63 names but the model has 64 genes"
    ):
        load_checkpoint(ST3 / "tiny_mlm", genes=genes)
    with pytest.raises(CheckpointError, match=r"has 63 names but the model has 64 genes"):
        load_checkpoint(REF / "absorb" / "hf", genes=genes)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("dup_name.json", '{"a": 0, "b": 1, "a": 2, "c": 3, "d": 4}', r"more than once: \['a'\]"),
        ("dup_index.json", '{"a": 0, "b": 1, "c": 1, "d": 3, "e": 4}', r"'b' and 'c' share"),
        (
            "range.json",
            '{"a": 0, "b": 1, "c": 3, "d": 4, "e": 5}',
            r"'e' has index 5, but the model has 5 perturbation rows \(0\.\.4\)",
        ),
        ("none.json", '{"a": -1, "b": -1}', r"gives no perturbation a usable index"),
        ("float.json", '{"a": 0, "b": 1.5}', r"'b' maps to 1\.5"),
        ("ctl_late.txt", "a\nnon-targeting\nb\nc\nd\n", r"control 'non-targeting' on line 2"),
        ("dup_line.txt", "a\nb\na\nc\nd\n", r"more than once: \['a'\]"),
        ("short.txt", "a\nb\nc\n", r"lists 3 perturbation names but the model has 5"),
    ],
)
def test_bad_perturbation_mappings(name: str, text: str, message: str, tmp_path: Path) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(ST3 / "tiny_pert", perturbations=tmp_path / name)
    assert name in str(err.value)


def test_bad_vectors_and_labels_for_unconditional_models(tmp_path: Path) -> None:
    torch.save({"GENE_A": torch.zeros(8)}, tmp_path / "vec.pt")
    with pytest.raises(CheckpointError, match=r"'GENE_A' must have shape \(16,\).*found \(8,\)"):
        load_checkpoint(ST3 / "tiny_pert_ct_esm", vectors=tmp_path / "vec.pt")
    with pytest.raises(CheckpointError, match="no precomputed_proj"):
        load_checkpoint(ST3 / "tiny_pert", vectors=tmp_path / "vec.pt")
    (tmp_path / "p.txt").write_text("a\n")
    with pytest.raises(CheckpointError, match="unconditional model"):
        load_checkpoint(ST3 / "tiny_mlm", perturbations=tmp_path / "p.txt")


def _dcm_experiment(tmp_path: Path, **args: object) -> Path:
    """tiny_pert laid out as DCM's release writes it: args.json names cond_labels_pt_path."""
    exp = tmp_path / "dcm"
    exp.mkdir()
    (exp / "final.pt").write_bytes((ST3 / "tiny_pert" / "final.pt").read_bytes())
    base = json.loads((ST3 / "tiny_pert" / "args.json").read_text())
    (exp / "args.json").write_text(json.dumps(base | args))
    return exp


def test_dcm_index_file_named_by_args_json_gives_each_name_its_index(tmp_path: Path) -> None:
    # DCM's scalar labels: {name: int}; a name absent from the data maps to -1 (no row).
    torch.save(
        {"PBS": 0, "IFNG": torch.tensor(3), "IL2": 1, "TNF": -1, "IL6": 4},
        tmp_path / "cytokines.pt",
    )
    exp = _dcm_experiment(tmp_path, cond_labels_pt_path=str(tmp_path / "cytokines.pt"),
                          control_name="PBS")  # fmt: skip
    loaded = load_checkpoint(exp)
    assert loaded.config.perturbations == ["PBS", "IL2", None, "IFNG", "IL6"]
    assert loaded.conditions == ["PBS", "IL2", "IFNG", "IL6"]
    assert loaded.perturbation_labels(["IFNG", "PBS", "IL6"]).tolist() == [3, 0, 4]
    assert loaded.config.control_label == "PBS"
    assert loaded.config.provenance.labels_file == str(tmp_path / "cytokines.pt")
    with pytest.raises(UnknownLabelError, match="TNF"):
        loaded.perturbation_labels(["TNF"])


def test_a_name_list_beside_the_index_file_never_reorders_it(tmp_path: Path) -> None:
    torch.save({"PBS": 0, "IL2": 4, "IFNG": 1, "IL6": 2, "IL10": 3}, tmp_path / "labels.pt")
    (tmp_path / "all.txt").write_text("PBS\nIL2\nIFNG\nIL6\nIL10\n")  # list order: IL2 = 1
    exp = _dcm_experiment(tmp_path, cond_labels_pt_path=str(tmp_path / "labels.pt"),
                          control_name="PBS")  # fmt: skip
    with pytest.warns(UserWarning, match=r"its order is not used.*'IL2' would be index 1, the "
                      r"index file says 4"):  # fmt: skip
        loaded = load_checkpoint(exp, perturbations=tmp_path / "all.txt")
    assert loaded.label_index("IL2") == 4
    assert loaded.label_index("IFNG") == 1


def test_an_index_file_passed_as_vectors_is_read_as_indices(tmp_path: Path) -> None:
    torch.save({"non-targeting": 0, "GENE_B": 2, "GENE_A": 1, "GENE_D": 4, "GENE_C": 3},
               tmp_path / "idx.pt")  # fmt: skip
    loaded = load_checkpoint(ST3 / "tiny_pert", vectors=tmp_path / "idx.pt")
    assert loaded.perturbation_vectors is None
    assert loaded.label_index("GENE_D") == 4


def test_a_vector_file_is_not_a_label_mapping(tmp_path: Path) -> None:
    torch.save({f"P{i}": torch.zeros(16) for i in range(5)}, tmp_path / "vec.pt")
    with pytest.raises(CheckpointError, match="maps names to vectors, not to label indices"):
        load_checkpoint(ST3 / "tiny_pert", perturbations=tmp_path / "vec.pt")


def test_the_release_all_perturbations_file_names_labels_when_control_is_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "all.txt").write_text("PBS\nIL2\nIFNG\nIL6\nIL10\n")
    exp = _dcm_experiment(tmp_path, all_perturbations_file=str(tmp_path / "all.txt"),
                          control_name="PBS")  # fmt: skip
    (exp / "perturbation_names_all.txt").unlink(missing_ok=True)
    loaded = load_checkpoint(exp)
    assert loaded.conditions == ["PBS", "IL2", "IFNG", "IL6", "IL10"]
    (tmp_path / "all.txt").write_text("IL2\nPBS\nIFNG\nIL6\nIL10\n")
    with pytest.raises(CheckpointError, match=r"control 'PBS' on line 2, not first"):
        load_checkpoint(exp)


def test_a_name_list_is_refused_when_trainings_index_file_is_missing(tmp_path: Path) -> None:
    # args.json says training read {name: index} labels from a file that did not come along:
    # the release's all_perturbations_file order cannot be proven to match it
    exp = _dcm_experiment(tmp_path, cond_labels_pt_path="datasets/1M/cytokines.pt",
                          control_name="non-targeting")  # fmt: skip
    (tmp_path / "all.txt").write_text("non-targeting\nGENE_A\nGENE_B\nGENE_C\nGENE_D\n")
    with pytest.raises(CheckpointError, match=r"datasets/1M/cytokines\.pt.*cannot be proven"):
        load_checkpoint(exp, perturbations=tmp_path / "all.txt")
    with pytest.warns(UserWarning, match="labels can be given only by index"):
        loaded = load_checkpoint(exp)  # no list: labels by index only, with a note
    assert loaded.conditions == []
    torch.save({"non-targeting": 0, "GENE_A": 3, "GENE_B": 1, "GENE_C": 2, "GENE_D": 4},
               tmp_path / "cytokines.pt")  # fmt: skip
    assert load_checkpoint(exp, perturbations=tmp_path / "cytokines.pt").label_index("GENE_A") == 3
