"""Checkpoint loading and saving: every upstream layout, the native round trip, bad inputs,
schema versions and the command line. Gene and label names: ``test_checkpoint_labels.py``."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest
import torch
from checkpoint_files import (
    REF,
    REF_ATOL,
    ST3,
    ST3_ATOL,
    TouchOnUnpickle,
    copy_tree,
    gene_file,
    load_io,
)
from safetensors.torch import load_file, save_file

from sedd.checkpoints import (
    CheckpointError,
    CheckpointNotFoundError,
    LoadedModel,
    detect_layout,
    load_checkpoint,
    save_native,
)
from sedd.checkpoints.schema import SCHEMA_VERSION, ModelConfig
from sedd.cli import main
from sedd.commands import args as command_args
from sedd.commands import loading

pytestmark = [
    pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL"),
    pytest.mark.usefixtures("fp32_no_grad"),
]


@pytest.fixture(scope="module")
def io() -> dict[str, torch.Tensor]:
    return load_io()


def _st3_outputs(loaded: LoadedModel, io: dict[str, torch.Tensor]) -> torch.Tensor:
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
def test_st3_experiment_reproduces_upstream_and_survives_native_round_trip(
    name: str, io: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    genes = gene_file(tmp_path)
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


def _perturbed_checkpoint(src: Path, dst: Path, value: float) -> None:
    payload = torch.load(src, weights_only=True)
    payload["model_state_dict"]["out_proj.weight"].fill_(value)
    torch.save(payload, dst)


def test_st3_checkpoint_preference_is_best_then_final_then_highest_epoch(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    shutil.copyfile(ST3 / "tiny_mlm" / "args.json", exp / "args.json")
    values = {"best.pt": 1.0, "final.pt": 2.0, "epoch_3.pt": 3.0, "epoch_10.pt": 10.0}
    for name, value in values.items():
        _perturbed_checkpoint(ST3 / "tiny_mlm" / "final.pt", exp / name, value)

    def chosen(**kwargs: str) -> tuple[str, float]:
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
def test_reference_layouts_reproduce_the_ema_log_score(graph: str, layout: str) -> None:
    scores = torch.load(REF / graph / "scores.pt", weights_only=True)
    loaded = load_checkpoint(REF / graph / layout)
    assert loaded.config.parametrisation == "score" and loaded.graph.config()["type"] == graph
    assert loaded.noise.config()["type"] == ("loglinear" if graph == "absorb" else "geometric")
    log_score = loaded.model(scores["x"], scores["sigma"])
    torch.testing.assert_close(log_score, scores["log_score"], rtol=0.0, atol=REF_ATOL)


@pytest.mark.parametrize("graph", ["absorb", "uniform"])
def test_training_run_uses_ema_by_default_and_raw_weights_on_request(graph: str) -> None:
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


def test_reference_model_converts_to_native_with_identical_scores(tmp_path: Path) -> None:
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
def test_detect_layout(path: Path, layout: str) -> None:
    assert detect_layout(path) == layout


# ----------------------------------------------------------------------------------------------
# Unsafe and damaged files
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["torch_save", "plain_pickle"])
def test_pickle_that_runs_code_is_refused_and_never_runs(writer: str, tmp_path: Path) -> None:
    control = tmp_path / "control_marker"
    pickle.loads(pickle.dumps(TouchOnUnpickle(control)))
    assert control.exists()  # the payload really runs code when unpickled unsafely

    marker = tmp_path / "marker"
    exp = copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    payload = {"model_state_dict": {"token_embed.weight": TouchOnUnpickle(marker)}}
    if writer == "torch_save":
        torch.save(payload, exp / "final.pt")
    else:
        (exp / "final.pt").write_bytes(pickle.dumps(payload))
    with pytest.raises(CheckpointError, match=r"refused to load .*final\.pt.*could run code"):
        load_checkpoint(exp)
    assert not marker.exists()


def test_missing_source_and_unknown_layout(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"nowhere does not exist; pass a native"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "mystery").mkdir()
    (tmp_path / "mystery" / "notes.bin").write_bytes(os.urandom(64))
    with pytest.raises(CheckpointError, match=r"cannot tell .*mystery.*notes\.bin.*args\.json"):
        load_checkpoint(tmp_path / "mystery")
    hf = copy_tree(REF / "absorb" / "hf", tmp_path / "hf")
    (hf / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights: expected model\.safetensors"):
        load_checkpoint(hf)


def test_missing_and_unexpected_keys_are_listed(tmp_path: Path) -> None:
    exp = copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
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


def test_shape_mismatch_names_key_expected_and_found(tmp_path: Path) -> None:
    exp = copy_tree(ST3 / "tiny_pert", tmp_path / "exp")
    args = json.loads((exp / "args.json").read_text())
    (exp / "args.json").write_text(json.dumps(args | {"num_genes": 32}))
    with pytest.raises(
        CheckpointError,
        match=r"final\.pt: shape mismatch for 'gene_embed\.weight': expected \(32, 64\) "
        r"\(from .*args\.json\), found \(64, 64\)",
    ):
        load_checkpoint(exp)


def test_shape_mismatch_in_a_native_model(tmp_path: Path) -> None:
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
def test_bad_st3_arguments(change: dict[str, int | None], message: str, tmp_path: Path) -> None:
    exp = copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    args = json.loads((exp / "args.json").read_text()) | change
    (exp / "args.json").write_text(json.dumps({k: v for k, v in args.items() if v is not None}))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(exp)


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_and_corrupt_files_are_named(tmp_path: Path) -> None:
    exp = copy_tree(ST3 / "tiny_mlm", tmp_path / "exp")
    _cut_in_half(exp / "final.pt")
    with pytest.raises(CheckpointError, match=r"final\.pt is truncated or corrupt.*copy it again"):
        load_checkpoint(exp)
    (exp / "final.pt").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match=r"final\.pt is truncated or corrupt"):
        load_checkpoint(exp)

    hf = copy_tree(REF / "absorb" / "hf", tmp_path / "hf")
    _cut_in_half(hf / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupt"):
        load_checkpoint(hf)
    (hf / "model.safetensors").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated or corrupt"):
        load_checkpoint(hf)

    run = copy_tree(REF / "absorb" / "run", tmp_path / "run")
    _cut_in_half(run / "checkpoints-meta" / "checkpoint.pth")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pth is truncated or corrupt"):
        load_checkpoint(run)


# ----------------------------------------------------------------------------------------------
# Schema versions
# ----------------------------------------------------------------------------------------------


def test_version_0_config_with_missing_fields_loads_through_the_migration(
    tmp_path: Path, io: dict[str, torch.Tensor]
) -> None:
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


def test_newer_schema_and_invalid_config_are_clear_errors(tmp_path: Path) -> None:
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


def test_cli_convert_then_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "native"
    genes = gene_file(tmp_path)
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


def test_cli_converts_a_training_run_with_raw_weights(tmp_path: Path) -> None:
    dst = tmp_path / "raw"
    assert main(["convert", str(REF / "uniform" / "run"), str(dst), "--raw-weights"]) == 0
    scores = torch.load(REF / "uniform" / "scores.pt", weights_only=True)
    loaded = load_checkpoint(dst)
    assert loaded.config.provenance.ema is False and loaded.config.provenance.step == 12345
    log_score = loaded.model(scores["x"], scores["sigma"])
    torch.testing.assert_close(log_score, scores["log_score_raw_weights"], rtol=0.0, atol=REF_ATOL)


def test_cli_reports_bad_input_as_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "missing does not exist" in capsys.readouterr().err
    assert main(["info", str(ST3 / "tiny_mlm")]) == 0
    assert "warning: GENES ARE POSITIONAL" in capsys.readouterr().err


def test_model_arguments_default_to_the_bundled_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser()
    command_args.add_model_arguments(parser)
    missing = tmp_path / "pbmc_default"
    with pytest.raises(CheckpointNotFoundError, match=r"bundled default model at .* pass --model"):
        loading.load_from_args(parser.parse_args([]), default=missing)
    args = parser.parse_args(
        ["--experiment-dir", str(ST3 / "tiny_pert"), "--checkpoint", "final.pt"]
    )
    assert loading.load_from_args(args, default=missing).config.num_perturbations == 5


def test_convert_writes_ordinary_file_modes(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        assert main(["convert", str(ST3 / "tiny_mlm"), str(tmp_path / "native")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "native").iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_layers": 10**9}, r"arch\.st3_perturbation\.num_layers: Input should be less than"),
        ({"hidden_dim": 10**12}, r"hidden_dim: Input should be less than or equal to 65536"),
        ({"hidden_dim": "64"}, r"hidden_dim: Input should be a valid integer"),
        ({"num_heads": True}, r"num_heads: Input should be a valid integer"),
    ],
)
def test_config_dimensions_are_bounded_and_strict(
    change: dict, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    native = save_native(load_checkpoint(ST3 / "tiny_pert"), tmp_path / "native")
    config = json.loads((native / "config.json").read_text())
    config["arch"] |= change
    (native / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(native)
    start = time.monotonic()
    assert main(["info", str(native)]) == 2  # a bad input, refused before anything is built
    assert time.monotonic() - start < 1.0
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("sedd info: error:") and "is not a valid model config: arch." in line


def test_a_negative_max_seq_len_and_integer_weights_are_refused(tmp_path: Path) -> None:
    native = save_native(load_checkpoint(ST3 / "tiny_mlm"), tmp_path / "native")
    config = json.loads((native / "config.json").read_text())
    (native / "config.json").write_text(
        json.dumps(config | {"arch": config["arch"] | {"max_seq_len": -1}})
    )
    with pytest.raises(
        CheckpointError, match=r"max_seq_len: Input should be greater than or equal to 1"
    ):
        load_checkpoint(native)
    (native / "config.json").write_text(json.dumps(config))
    weights = load_file(native / "model.safetensors")
    key = next(iter(weights))
    weights[key] = weights[key].round().long()
    save_file(weights, native / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"not floating point \(int64\) in .*convert"):
        load_checkpoint(native)
