"""Checkpoint loading and saving: every upstream layout, the native round trip, and bad inputs."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sedd.checkpoints import (
    CheckpointError,
    CheckpointNotFoundError,
    UnknownLabelError,
    detect_layout,
    load_checkpoint,
    save_native,
)
from sedd.cli import main
from sedd.commands import checkpoints as checkpoint_commands
from sedd.config import SCHEMA_VERSION, ModelConfig

DATA = Path(__file__).parent / "data"
ST3 = DATA / "st3" / "experiments"
REF = DATA / "sedd_reference"
ST3_ATOL = 1e-6  # st3 logits are ~1e-3 in size (N(0, 0.02) init); see test_model_parity.py
REF_ATOL = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore:no gene list")


@pytest.fixture(autouse=True)
def _fp32_no_grad():
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        yield


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return torch.load(DATA / "st3" / "io_fixture.pt", weights_only=True)


def _copy_tree(src: Path, dst: Path) -> Path:
    """Copy with fresh (writable) permissions; the fixtures are read-only."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dst


def _gene_file(tmp_path: Path, n: int = 64, name: str = "genes.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(f"GENE{i}" for i in range(n)) + "\n")
    return path


def _st3_outputs(loaded, io) -> torch.Tensor:
    match loaded.config.provenance.source and Path(loaded.config.provenance.source).name:
        case "tiny_mlm":
            return loaded.model(io["x"], io["sigma"])
        case "tiny_pert":
            return loaded.model(io["x"], io["sigma"], labels=io["pert_labels"])
        case _:
            logits = loaded.model(io["x"], io["sigma"], io["pert_vec"], io["cell_type_labels"])
            return torch.log_softmax(logits, dim=-1)


ST3_EXPECTED = {
    "tiny_mlm": "mlm_logits",
    "tiny_pert": "pert_logits",
    "tiny_pert_ct_esm": "pert_ct_score",
}


# ----------------------------------------------------------------------------------------------
# st3 experiments
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ST3_EXPECTED))
def test_st3_experiment_reproduces_upstream_and_survives_native_round_trip(name, io, tmp_path):
    genes = _gene_file(tmp_path)
    loaded = load_checkpoint(ST3 / name, genes=genes)
    assert loaded.layout == "st3" and not loaded.model.training
    out = _st3_outputs(loaded, io)
    torch.testing.assert_close(out, io[ST3_EXPECTED[name]], rtol=0.0, atol=ST3_ATOL)

    native = save_native(loaded, tmp_path / "native")
    assert {p.name for p in native.iterdir()} >= {"config.json", "model.safetensors"}
    assert all(t.dtype == torch.float32 for t in load_file(native / "model.safetensors").values())
    again = load_checkpoint(native)
    assert again.layout == "native"
    assert torch.equal(_st3_outputs(again, io), out)  # bit-identical
    for field in ("genes", "perturbations", "control_label", "cell_types", "arch", "noise"):
        assert getattr(again.config, field) == getattr(loaded.config, field), field
    assert again.config.genes[:2] == ["GENE0", "GENE1"]
    assert again.config.provenance.source_hash == loaded.file_hash
    assert again.file_hash != loaded.file_hash  # the native weights file is a new file


def test_st3_labels_come_from_the_experiment_side_files(tmp_path):
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


def test_checkpoint_with_optimizer_state_loads_and_warns_about_unnamed_labels():
    with pytest.warns(UserWarning, match=r"no perturbation names .*--perturbations FILE"):
        loaded = load_checkpoint(ST3 / "tiny_pert_2steps")
    assert loaded.config.provenance.step == 2 and loaded.config.perturbations is None
    with pytest.raises(UnknownLabelError, match=r"has no perturbation names.*--perturbations"):
        loaded.label_index("GENE_A")


def test_unknown_label_suggests_close_names():
    pert = load_checkpoint(ST3 / "tiny_pert")
    with pytest.raises(UnknownLabelError, match="did you mean 'GENE_A'") as err:
        pert.label_index("GENE_a")
    assert err.value.name == "GENE_a" and err.value.suggestions[0] == "GENE_A"
    with pytest.raises(UnknownLabelError, match="has no cell type names"):
        pert.cell_type_index("hepg2")


def test_missing_gene_list_warns_and_names_genes_by_position():
    with pytest.warns(UserWarning, match=r"named by position .*--genes FILE"):
        loaded = load_checkpoint(ST3 / "tiny_mlm")
    assert loaded.config.genes[:3] == ["0", "1", "2"] and loaded.config.genes_by_position


def test_gene_list_from_h5ad_var_names(tmp_path):
    import anndata
    import numpy as np
    import pandas as pd

    names = [f"h5gene{i}" for i in range(64)]
    adata = anndata.AnnData(np.zeros((2, 64), dtype=np.float32), var=pd.DataFrame(index=names))
    adata.write_h5ad(tmp_path / "ref.h5ad")
    assert load_checkpoint(ST3 / "tiny_mlm", genes=tmp_path / "ref.h5ad").config.genes == names


def test_json_perturbation_mapping_sets_label_order(tmp_path):
    mapping = {"ctrl": 0, "B": 2, "A": 1, "D": 4, "C": 3}
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    loaded = load_checkpoint(ST3 / "tiny_pert", perturbations=tmp_path / "map.json")
    assert loaded.config.perturbations == ["ctrl", "A", "B", "C", "D"]
    assert loaded.config.control_label == "ctrl"  # args.json's name is absent: index 0
    assert loaded.label_index("C") == 3


def _perturbed_checkpoint(src: Path, dst: Path, value: float) -> None:
    payload = torch.load(src, weights_only=True)
    payload["model_state_dict"]["out_proj.weight"].fill_(value)
    torch.save(payload, dst)


def test_st3_checkpoint_preference_is_best_then_final_then_highest_epoch(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    shutil.copyfile(ST3 / "tiny_mlm" / "args.json", exp / "args.json")
    values = {"best.pt": 1.0, "final.pt": 2.0, "epoch_3.pt": 3.0, "epoch_10.pt": 10.0}
    for name, value in values.items():
        _perturbed_checkpoint(ST3 / "tiny_mlm" / "final.pt", exp / name, value)

    def chosen(**kwargs) -> tuple[str, float]:
        loaded = load_checkpoint(exp, **kwargs)
        return loaded.config.provenance.source_file, loaded.model.out_proj.weight[0, 0].item()

    assert chosen() == ("best.pt", 1.0)
    assert chosen(checkpoint="epoch_3.pt") == ("epoch_3.pt", 3.0)
    assert load_checkpoint(exp / "epoch_3.pt").model.out_proj.weight[0, 0].item() == 3.0
    (exp / "best.pt").unlink()
    assert chosen() == ("final.pt", 2.0)
    (exp / "final.pt").unlink()
    assert chosen() == ("epoch_10.pt", 10.0)  # numeric, not lexicographic, order
    with pytest.raises(CheckpointError, match=r"epoch_7\.pt does not exist.*epoch_10\.pt"):
        load_checkpoint(exp, checkpoint="epoch_7.pt")


# ----------------------------------------------------------------------------------------------
# Reference SEDD
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph", ["absorb", "uniform"])
@pytest.mark.parametrize("layout", ["hf", "hf_bin", "run", "run/checkpoints-meta/checkpoint.pth"])
def test_reference_layouts_reproduce_the_ema_log_score(graph, layout):
    scores = torch.load(REF / graph / "scores.pt", weights_only=True)
    loaded = load_checkpoint(REF / graph / layout)
    assert loaded.config.parametrisation == "score" and loaded.graph.config()["type"] == graph
    assert loaded.noise.config()["type"] == ("loglinear" if graph == "absorb" else "geometric")
    log_score = loaded.model(scores["x"], scores["sigma"])
    torch.testing.assert_close(log_score, scores["log_score"], rtol=0.0, atol=REF_ATOL)


@pytest.mark.parametrize("graph", ["absorb", "uniform"])
def test_training_run_uses_ema_by_default_and_raw_weights_on_request(graph):
    scores = torch.load(REF / graph / "scores.pt", weights_only=True)
    ema = load_checkpoint(REF / graph / "run")
    expected = torch.load(REF / graph / "model_state_dict.pt", weights_only=True)
    for key, value in ema.model.state_dict().items():
        assert torch.equal(value, expected[key]), key  # shadow params mapped in order
    assert ema.config.provenance.ema is True and ema.config.provenance.step == 12345

    raw = load_checkpoint(REF / graph / "run", use_ema=False)
    raw_score = raw.model(scores["x"], scores["sigma"])
    torch.testing.assert_close(raw_score, scores["log_score_raw_weights"], rtol=0.0, atol=REF_ATOL)
    assert (raw_score - ema.model(scores["x"], scores["sigma"])).abs().max() > 0.1


def test_reference_model_converts_to_native_with_identical_scores(tmp_path):
    scores = torch.load(REF / "absorb" / "scores.pt", weights_only=True)
    loaded = load_checkpoint(REF / "absorb" / "run")
    again = load_checkpoint(save_native(loaded, tmp_path / "native"))
    assert torch.equal(
        again.model(scores["x"], scores["sigma"]), loaded.model(scores["x"], scores["sigma"])
    )
    assert again.config.tokens.mask_index == 32 and again.config.graph.dim == 33


@pytest.mark.parametrize(
    ("path", "layout"),
    [
        (REF / "absorb" / "hf", "sedd_hf"),
        (REF / "absorb" / "hf_bin" / "pytorch_model.bin", "sedd_hf"),
        (REF / "uniform" / "run", "sedd_run"),
        (ST3 / "tiny_pert", "st3"),
        (ST3 / "tiny_pert" / "final.pt", "st3"),
    ],
)
def test_detect_layout(path, layout):
    assert detect_layout(path) == layout


# ----------------------------------------------------------------------------------------------
# Unsafe and damaged files
# ----------------------------------------------------------------------------------------------


class _TouchOnUnpickle:
    """Unpickling this object calls Path.touch(marker): a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.mark.parametrize("writer", ["torch_save", "plain_pickle"])
def test_pickle_that_runs_code_is_refused_and_never_runs(writer, tmp_path):
    control = tmp_path / "control_marker"
    pickle.loads(pickle.dumps(_TouchOnUnpickle(control)))
    assert control.exists()  # the payload really runs code when unpickled unsafely

    marker = tmp_path / "marker"
    exp = _copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    payload = {"model_state_dict": {"token_embed.weight": _TouchOnUnpickle(marker)}}
    if writer == "torch_save":
        torch.save(payload, exp / "final.pt")
    else:
        (exp / "final.pt").write_bytes(pickle.dumps(payload))
    with pytest.raises(CheckpointError, match=r"refused to load .*final\.pt.*could run code"):
        load_checkpoint(exp)
    assert not marker.exists()


def test_pickled_code_in_a_side_file_is_refused(tmp_path):
    marker = tmp_path / "marker"
    torch.save({"GENE_A": _TouchOnUnpickle(marker)}, tmp_path / "vectors.pt")
    with pytest.raises(CheckpointError, match=r"refused to load .*vectors\.pt"):
        load_checkpoint(ST3 / "tiny_pert_ct_esm", vectors=tmp_path / "vectors.pt")
    assert not marker.exists()


def test_missing_source_and_unknown_layout(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=r"nowhere does not exist; pass a native"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "mystery").mkdir()
    (tmp_path / "mystery" / "notes.bin").write_bytes(os.urandom(64))
    with pytest.raises(CheckpointError, match=r"cannot tell .*mystery.*notes\.bin.*args\.json"):
        load_checkpoint(tmp_path / "mystery")
    hf = _copy_tree(REF / "absorb" / "hf", tmp_path / "hf")
    (hf / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights: expected model\.safetensors"):
        load_checkpoint(hf)


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    exp = _copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    payload = torch.load(exp / "final.pt", weights_only=True)
    del payload["model_state_dict"]["out_proj.weight"]
    payload["model_state_dict"]["extra_head.weight"] = torch.zeros(3)
    torch.save(payload, exp / "final.pt")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(exp)
    message = str(err.value)
    assert "final.pt" in message and "args.json" in message
    assert "missing keys (the model needs them): out_proj.weight" in message
    assert "unexpected keys (the model has no such weights): extra_head.weight" in message


def test_shape_mismatch_names_key_expected_and_found(tmp_path):
    exp = _copy_tree(ST3 / "tiny_pert", tmp_path / "exp")
    args = json.loads((exp / "args.json").read_text())
    (exp / "args.json").write_text(json.dumps(args | {"num_genes": 32}))
    with pytest.raises(
        CheckpointError,
        match=r"final\.pt: shape mismatch for 'gene_embed\.weight': expected \(32, 64\) "
        r"\(from .*args\.json\), found \(64, 64\)",
    ):
        load_checkpoint(exp)


def test_shape_mismatch_in_a_native_model(tmp_path):
    native = save_native(load_checkpoint(ST3 / "tiny_mlm"), tmp_path / "native")
    config = json.loads((native / "config.json").read_text())
    config["arch"]["hidden_dim"] = 32
    (native / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"'token_embed\.weight': expected \(21, 32\)"):
        load_checkpoint(native)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": None}, r"args\.json has no num_heads.*add \"num_heads\": N"),
        ({"num_heads": 3}, r"args\.json describes an invalid model: .*must split into"),
        ({"num_layers": 3}, r"missing keys .*blocks\.2\."),
    ],
)
def test_bad_st3_arguments(change, message, tmp_path):
    exp = _copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    args = json.loads((exp / "args.json").read_text()) | change
    (exp / "args.json").write_text(json.dumps({k: v for k, v in args.items() if v is not None}))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(exp)


def test_native_model_takes_gene_names_and_resaves_in_place(tmp_path, io):
    native = save_native(load_checkpoint(ST3 / "tiny_pert_ct_esm"), tmp_path / "native")
    loaded = load_checkpoint(native, genes=_gene_file(tmp_path))
    save_native(loaded, native)
    again = load_checkpoint(native)
    assert again.config.genes[-1] == "GENE63" and not again.config.genes_by_position
    assert list(again.perturbation_vectors) == list(loaded.perturbation_vectors)
    out = again.model(io["x"], io["sigma"], io["pert_vec"], io["cell_type_labels"])
    expected = loaded.model(io["x"], io["sigma"], io["pert_vec"], io["cell_type_labels"])
    assert torch.equal(out, expected)


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_and_corrupt_files_are_named(tmp_path):
    exp = _copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    _cut_in_half(exp / "final.pt")
    with pytest.raises(CheckpointError, match=r"final\.pt is truncated or corrupt.*copy it again"):
        load_checkpoint(exp)
    (exp / "final.pt").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match=r"final\.pt is truncated or corrupt"):
        load_checkpoint(exp)

    hf = _copy_tree(REF / "absorb" / "hf", tmp_path / "hf")
    _cut_in_half(hf / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupt"):
        load_checkpoint(hf)
    (hf / "model.safetensors").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupt"):
        load_checkpoint(hf)

    run = _copy_tree(REF / "absorb" / "run", tmp_path / "run")
    _cut_in_half(run / "checkpoints-meta" / "checkpoint.pth")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pth is truncated or corrupt"):
        load_checkpoint(run)


def test_gene_list_of_the_wrong_length(tmp_path):
    genes = _gene_file(tmp_path, n=63)
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
        ("dup_index.json", '{"a": 0, "b": 1, "c": 1, "d": 3, "e": 4}', r"1: \['b', 'c'\]"),
        (
            "skip.json",
            '{"a": 0, "b": 1, "c": 3, "d": 4, "e": 5}',
            r"skipped: \[2\], out of range: \[5\]",
        ),
        ("short.json", '{"a": 0, "b": 1}', r"skipped: \[2, 3, 4\]"),
        ("dup_line.txt", "a\nb\na\nc\nd\n", r"more than once: \['a'\]"),
        ("short.txt", "a\nb\nc\n", r"lists 3 perturbation names but the model has 5"),
    ],
)
def test_bad_perturbation_mappings(name, text, message, tmp_path):
    (tmp_path / name).write_text(text)
    with pytest.raises(CheckpointError, match=message) as err:
        load_checkpoint(ST3 / "tiny_pert", perturbations=tmp_path / name)
    assert name in str(err.value)


def test_bad_vectors_and_labels_for_unconditional_models(tmp_path):
    torch.save({"GENE_A": torch.zeros(8)}, tmp_path / "vec.pt")
    with pytest.raises(CheckpointError, match=r"'GENE_A' must have shape \(16,\).*found \(8,\)"):
        load_checkpoint(ST3 / "tiny_pert_ct_esm", vectors=tmp_path / "vec.pt")
    with pytest.raises(CheckpointError, match="no precomputed_proj"):
        load_checkpoint(ST3 / "tiny_pert", vectors=tmp_path / "vec.pt")
    (tmp_path / "p.txt").write_text("a\n")
    with pytest.raises(CheckpointError, match="unconditional model"):
        load_checkpoint(ST3 / "tiny_mlm", perturbations=tmp_path / "p.txt")


# ----------------------------------------------------------------------------------------------
# Schema versions
# ----------------------------------------------------------------------------------------------


def test_version_0_config_with_missing_fields_loads_through_the_migration(tmp_path, io):
    loaded = load_checkpoint(ST3 / "tiny_mlm")
    native = save_native(loaded, tmp_path / "native")
    full = json.loads((native / "config.json").read_text())
    old = {"architecture": full["architecture"], "arch": full["arch"]}  # version 0: no version
    (native / "config.json").write_text(json.dumps(old))
    again = load_checkpoint(native)
    assert again.config.schema_version == SCHEMA_VERSION
    assert again.config.parametrisation == "x0" and again.config.tokens.mask_index == 20
    assert again.config.noise.model_dump() == {"type": "loglinear", "eps": 1e-3}
    assert torch.equal(again.model(io["x"], io["sigma"]), loaded.model(io["x"], io["sigma"]))


def test_newer_schema_and_invalid_config_are_clear_errors(tmp_path):
    native = save_native(load_checkpoint(ST3 / "tiny_mlm"), tmp_path / "native")
    config = json.loads((native / "config.json").read_text())
    (native / "config.json").write_text(json.dumps(config | {"schema_version": 99}))
    with pytest.raises(CheckpointError, match=r"config\.json .*schema_version 99 is newer"):
        load_checkpoint(native)
    (native / "config.json").write_text(json.dumps(config | {"genes": ["a", "b"]}))
    with pytest.raises(CheckpointError, match=r"`genes` must list 64 names"):
        load_checkpoint(native)
    with pytest.raises(ValueError, match="control_label 'x' is not one of the perturbations"):
        pert = load_checkpoint(ST3 / "tiny_pert").config.model_dump()
        ModelConfig.model_validate(pert | {"control_label": "x"})


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


def test_cli_convert_then_info(tmp_path, capsys):
    dst = tmp_path / "native"
    genes = _gene_file(tmp_path)
    argv = ["convert", str(ST3 / "tiny_pert"), str(dst), "--genes", str(genes)]
    assert main([*argv, "--training-command", "python train.py", "--data-hash", "abc"]) == 0
    assert (dst / "config.json").is_file() and (dst / "model.safetensors").is_file()
    capsys.readouterr()

    assert main(["info", str(dst)]) == 0
    card = capsys.readouterr().out
    loaded = load_checkpoint(dst)
    assert "st3_perturbation" in card
    assert f"{loaded.num_parameters:,}" in card
    assert loaded.file_hash in card
    assert "GENE0, GENE1" in card and "non-targeting" in card and "python train.py" in card

    assert main(["info", str(dst), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["sha256"] == loaded.file_hash and card["num_parameters"] == loaded.num_parameters
    assert card["perturbations"][0] == "non-targeting" and card["provenance"]["data_hash"] == "abc"


def test_cli_converts_a_training_run_with_raw_weights(tmp_path):
    dst = tmp_path / "raw"
    assert main(["convert", str(REF / "uniform" / "run"), str(dst), "--raw-weights"]) == 0
    scores = torch.load(REF / "uniform" / "scores.pt", weights_only=True)
    loaded = load_checkpoint(dst)
    assert loaded.config.provenance.ema is False and loaded.config.provenance.step == 12345
    log_score = loaded.model(scores["x"], scores["sigma"])
    torch.testing.assert_close(log_score, scores["log_score_raw_weights"], rtol=0.0, atol=REF_ATOL)


def test_cli_reports_bad_input_as_a_clean_error(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "missing does not exist" in capsys.readouterr().err
    assert main(["info", str(ST3 / "tiny_mlm")]) == 0
    assert "warning: no gene list" in capsys.readouterr().err


def test_model_arguments_default_to_the_bundled_model(tmp_path, monkeypatch):
    import argparse

    parser = argparse.ArgumentParser()
    checkpoint_commands.add_model_arguments(parser)
    monkeypatch.setattr(checkpoint_commands, "DEFAULT_MODEL", tmp_path / "pbmc_default")
    with pytest.raises(CheckpointNotFoundError, match=r"bundled default model at .* pass --model"):
        checkpoint_commands.load_from_args(parser.parse_args([]))
    args = parser.parse_args(
        ["--experiment-dir", str(ST3 / "tiny_pert"), "--checkpoint", "final.pt"]
    )
    assert checkpoint_commands.load_from_args(args).config.num_perturbations == 5
