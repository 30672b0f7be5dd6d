"""Training: optimizer-step accounting, exact resume, precision rules, the ELBO weight, saving."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from pydantic import ValidationError

from sedd.checkpoints import load_checkpoint
from sedd.cli import main as cli_main
from sedd.commands import train as train_command
from sedd.diffusion.graph import AbsorbingGraph
from sedd.diffusion.noise import LogLinearNoise
from sedd.diffusion.st3_samplers import EulerSampler
from sedd.io.files import sha256_file
from sedd.precision import PrecisionError
from sedd.train.config import (
    TrainConfig,
    TrainingData,
    load_train_config,
    lr_factor,
    model_config,
)
from sedd.train.trainer import STATE_FILE, Trainer, elbo_weight, forward_logits, loss_terms

N_CELLS, N_GENES = 30, 10
LABELS = ["beta", "alpha", "gamma"]  # deliberately unsorted: the model stores them sorted


@pytest.fixture()
def data_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    counts = rng.poisson(1.5, size=(N_CELLS, N_GENES)).astype(np.int32)
    counts[3, 4] = 17  # the largest training count: num_bins must become 18
    obs = pd.DataFrame(
        {
            "group": [LABELS[i % 3] for i in range(N_CELLS)],
            "split": ["train"] * 24 + ["test"] * 6,
        },
        index=[f"cell{i}" for i in range(N_CELLS)],
    )
    var = pd.DataFrame(index=[f"gene{i}" for i in range(N_GENES)])
    path = tmp_path / "cells.h5ad"
    anndata.AnnData(X=sp.csr_matrix(counts), obs=obs, var=var).write_h5ad(path)
    return path


def _config(tmp_path: Path, data_file: Path, name: str = "run", **overrides) -> TrainConfig:
    settings = {
        "data": str(data_file),
        "condition_key": "group",
        "arch": {"hidden_dim": 16, "num_layers": 1, "num_heads": 2},
        "batch_size": 4,
        "max_steps": 2,
        "warmup_steps": 1,
        "lr": 1e-2,
        "log_every": 1,
        "out": str(tmp_path / name / "model"),
        "run_dir": str(tmp_path / name / "state"),
        **overrides,
    }
    return TrainConfig.model_validate(settings)


def _batch(trainer: Trainer, micro_batch: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows = trainer.batch_indices(micro_batch)
    labels = None if trainer.data.labels is None else trainer.data.labels[rows]
    return trainer.data.tokens[rows], labels


def test_accumulation_counts_optimizer_steps_micro_batches_and_schedule(tmp_path, data_file):
    config = _config(tmp_path, data_file, accum_steps=2, val_split=None)
    trainer = Trainer(config, progress=False)
    updates, forwards = [], []
    trainer.optimizer.register_step_post_hook(lambda *_: updates.append(1))
    trainer.model.out_proj.register_forward_hook(lambda _m, _i, out: forwards.append(len(out)))

    summary = trainer.fit()

    assert len(updates) == 2 and trainer.step == summary.step == 2
    assert forwards == [4, 4, 4, 4] and summary.micro_batches == trainer.micro_batches == 4
    assert trainer.scheduler.last_epoch == 2
    expected = lr_factor(2, warmup=1, max_steps=2, schedule="cosine", min_ratio=0.1)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * expected)
    saved = torch.load(Path(config.run_dir) / STATE_FILE, weights_only=True)
    assert (saved["step"], saved["micro_batches"]) == (2, 4)
    assert saved["scheduler"]["last_epoch"] == 2


def test_accumulated_gradient_is_the_mean_of_micro_batch_gradients(tmp_path, data_file):
    config = _config(tmp_path, data_file, accum_steps=2, grad_clip=None, val_split=None)
    trainer = Trainer(config, progress=False)
    seen: dict[str, torch.Tensor] = {}

    def grab(_optimizer, _args, _kwargs) -> None:
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})

    trainer.optimizer.register_step_pre_hook(grab)
    trainer.train_step()

    manual = Trainer(config, progress=False)  # same seeds: same weights, batches, masks, dropout
    losses = [manual.loss(*_batch(manual, k)) for k in range(2)]
    (sum(losses) / 2).backward()
    for name, param in manual.model.named_parameters():
        torch.testing.assert_close(seen[name], param.grad, rtol=1e-5, atol=1e-7)


def test_resume_from_step_one_matches_an_uninterrupted_run(tmp_path, data_file):
    straight = Trainer(_config(tmp_path, data_file, "straight", accum_steps=2), progress=False)
    straight.fit()

    config = _config(tmp_path, data_file, "resumed", accum_steps=2)
    first = Trainer(config, progress=False)
    assert first.fit(until=1).step == 1
    saved = torch.load(Path(config.run_dir) / STATE_FILE, weights_only=True)
    assert saved["step"] == 1
    torch.manual_seed(1234)  # disturb the global RNG: resume must restore it
    resumed = Trainer(config, resume=True, progress=False)
    assert resumed.step == 1
    summary = resumed.fit()
    assert (summary.start_step, summary.step, resumed.micro_batches) == (1, 2, 4)

    for part in ("model", "ema"):
        want = getattr(straight, part) if part == "model" else straight.ema.model
        got = getattr(resumed, part) if part == "model" else resumed.ema.model
        for (name, a), b in zip(want.state_dict().items(), got.state_dict().values(), strict=True):
            assert torch.equal(a, b), f"{part}.{name} differs after resume"
    assert resumed.scheduler.last_epoch == straight.scheduler.last_epoch == 2


def test_resume_refuses_a_changed_configuration(tmp_path, data_file):
    Trainer(_config(tmp_path, data_file), progress=False).fit(until=1)
    with pytest.raises(ValueError, match=r"lr: 0\.01 -> 0\.5"):
        Trainer(_config(tmp_path, data_file, lr=0.5), resume=True, progress=False)
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        Trainer(_config(tmp_path, data_file, "fresh"), resume=True, progress=False)


def test_resume_may_change_the_schedule_shape_and_dropout(tmp_path, data_file):
    """A second phase: same base LR, flat instead of cosine, dropout off."""
    first = _config(tmp_path, data_file, max_steps=4, warmup_steps=1)
    Trainer(first, progress=False).fit(until=2)
    second = _config(
        tmp_path,
        data_file,
        max_steps=4,
        warmup_steps=1,
        schedule="constant",
        arch={"hidden_dim": 16, "num_layers": 1, "num_heads": 2, "dropout": 0.0},
    )
    trainer = Trainer(second, resume=True, progress=False)
    assert trainer.step == 2
    assert trainer.model.blocks[0].ff.net[2].p == 0.0
    trainer.fit()
    assert trainer.step == 4
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # flat: the base LR
    with pytest.raises(ValueError, match=r"arch: .*'num_layers': 1.* -> .*'num_layers': 2"):
        Trainer(
            _config(
                tmp_path,
                data_file,
                max_steps=6,
                arch={"hidden_dim": 16, "num_layers": 2, "num_heads": 2},
            ),
            resume=True,
            progress=False,
        )


def test_activation_checkpointing_gives_the_same_loss_and_gradients(tmp_path, data_file):
    results = []
    for on in (False, True):
        config = _config(tmp_path, data_file, activation_checkpointing=on, val_split=None)
        trainer = Trainer(config, progress=False)
        loss = trainer.loss(*_batch(trainer))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
        results.append((loss.detach(), grads))
    (loss_off, grads_off), (loss_on, grads_on) = results
    assert torch.isfinite(loss_on)
    torch.testing.assert_close(loss_on, loss_off, rtol=1e-6, atol=1e-7)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, rtol=1e-5, atol=1e-7)


def test_forward_logits_equals_the_model_forward(tmp_path, data_file):
    trainer = Trainer(_config(tmp_path, data_file), progress=False)
    x0, labels = _batch(trainer)
    sigma = torch.linspace(0.1, 3.0, x0.shape[0])
    model = trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(forward_logits(model, x0, sigma, labels), model(x0, sigma, labels))
    model.train()
    torch.manual_seed(5)
    plain = model(x0, sigma, labels)
    torch.manual_seed(5)
    checkpointed = forward_logits(model, x0, sigma, labels, checkpoint_blocks=True)
    assert torch.equal(plain, checkpointed)  # same dropout masks, same arithmetic


def test_elbo_weight_is_one_over_t_for_the_log_linear_schedule():
    t = torch.linspace(1e-3, 1.0, 101, dtype=torch.float64)
    for eps in (1e-3, 1e-2):
        weight = elbo_weight(LogLinearNoise(eps), t)
        torch.testing.assert_close(weight, 1 / t, rtol=1e-12, atol=0.0)
    # sigma'(t) / (e^sigma - 1) at one point, by hand: eps = 1e-3, t = 0.25
    sigma = -math.log(1 - 0.999 * 0.25)
    by_hand = 0.999 / (1 - 0.999 * 0.25) / math.expm1(sigma)
    assert by_hand == pytest.approx(4.0, rel=1e-12)


def test_elbo_sums_weighted_masked_nll_per_gene_and_ignores_the_mask_class():
    num_bins, genes = 5, 8
    noise, graph = LogLinearNoise(1e-3), AbsorbingGraph(num_bins)
    x0 = torch.randint(0, num_bins, (3, genes), generator=torch.Generator().manual_seed(0))
    xt = x0.clone()
    xt[0, :2] = xt[1, :5] = num_bins  # 2, 5 and 0 masked genes
    t = torch.tensor([0.5, 0.25, 0.9])
    logits = torch.zeros(3, genes, num_bins + 1)
    logits[..., num_bins] = 50.0  # a confident mask class must not change the loss
    terms = loss_terms(logits, x0, xt, t, noise, graph.dim - 1)
    per_gene = math.log(num_bins) / genes  # uniform over the real classes
    expected = torch.tensor([2 / 0.5, 5 / 0.25, 0.0]) * per_gene
    torch.testing.assert_close(terms.elbo, expected, rtol=1e-5, atol=1e-7)
    assert terms.n_masked == 7
    assert terms.loss("masked_ce").item() == pytest.approx(math.log(num_bins), rel=1e-6)
    assert terms.elbo.dtype == torch.float32


def test_bf16_training_step_runs_on_cpu_with_an_fp32_loss(tmp_path, data_file):
    trainer = Trainer(_config(tmp_path, data_file, amp="bf16", val_split=None), progress=False)
    logit_dtypes = []
    trainer.model.out_proj.register_forward_hook(lambda _m, _i, out: logit_dtypes.append(out.dtype))
    loss = trainer.loss(*_batch(trainer))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert logit_dtypes == [torch.bfloat16]  # autocast really covered the forward
    value, grad_norm, cells = trainer.train_step()
    assert math.isfinite(value) and math.isfinite(grad_norm) and cells == 4
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(p.dtype == torch.float32 for p in trainer.ema.model.parameters())
    state = trainer.optimizer.state_dict()["state"]
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())


def test_fp16_training_on_cpu_is_refused(tmp_path, data_file):
    with pytest.raises(PrecisionError, match=r"fp16' training needs CUDA.*'bf16' or 'fp32'"):
        Trainer(_config(tmp_path, data_file, amp="fp16", device="cpu"), progress=False)


def test_saved_model_loads_with_genes_labels_and_provenance(tmp_path, data_file):
    config = _config(tmp_path, data_file, max_steps=3, checkpoint_every=2, control_label="beta")
    trainer = Trainer(config, command="sedd train --config x.json", progress=False)
    trainer.fit()

    loaded = load_checkpoint(config.out)
    cfg = loaded.config
    assert cfg.architecture == "st3_perturbation"
    assert cfg.genes == [f"gene{i}" for i in range(N_GENES)]
    assert cfg.perturbations == sorted(LABELS) and cfg.control_label == "beta"
    # generated cells carry the label under the column it was trained from
    assert (cfg.label_key, cfg.label_kind) == ("group", "cell_type")
    assert (cfg.tokens.num_bins, cfg.tokens.mask_index, cfg.graph.dim) == (18, 18, 19)
    assert cfg.noise.eps == 1e-3
    assert cfg.provenance.training_command == "sedd train --config x.json"
    assert cfg.provenance.data_hash == sha256_file(data_file)
    assert (cfg.provenance.step, cfg.provenance.ema) == (3, True)
    assert sorted(p.name for p in Path(config.out).iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    for name, value in trainer.ema.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], value), name

    sampler = EulerSampler(loaded.model, loaded.noise, loaded.graph, use_amp=False)
    labels = loaded.perturbation_labels(["gamma", "alpha"])
    tokens = sampler.sample(2, steps=3, seed=0, labels=labels)
    assert tokens.shape == (2, N_GENES)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < cfg.tokens.num_bins


def test_the_model_config_records_the_label_key_and_kind_unless_the_key_is_reserved():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    data = TrainingData(tokens, None, None, None, ["a", "b", "c"], ["x", "y"], 4, "0" * 64)
    perturb = TrainConfig(condition_key="guide", label_kind="perturbation")
    cfg = model_config(perturb, data)
    assert (cfg.label_key, cfg.label_kind) == ("guide", "perturbation")
    assert cfg.label_columns == ["condition", "guide", "perturbation"]
    # "cell_type" is already a column of generated cells: the label stays under "condition"
    assert model_config(TrainConfig(condition_key="cell_type"), data).label_key is None
    unconditional = TrainingData(tokens, None, None, None, ["a", "b", "c"], None, 4, "0" * 64)
    assert model_config(perturb, unconditional).label_key is None
    with pytest.raises(ValidationError, match="label_kind"):
        TrainConfig.model_validate({"label_kind": "drug"})


def test_control_label_must_be_one_of_the_labels(tmp_path, data_file):
    with pytest.raises(ValueError, match="control_label 'delta' is not one of the 'group' labels"):
        Trainer(_config(tmp_path, data_file, control_label="delta"), progress=False)


def test_old_config_without_new_fields_loads_with_defaults(tmp_path, data_file):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"data": str(data_file), "max_steps": 7, "arch": {"hidden_dim": 32}}))
    config = load_train_config(old, out="elsewhere")
    assert (config.max_steps, config.arch.hidden_dim, config.out) == (7, 32, "elsewhere")
    assert config.objective == "elbo" and config.amp == "fp32" and config.accum_steps == 1
    assert config.activation_checkpointing is False and config.ema_decay == 0.999
    assert config.run_path == Path("elsewhere") / "training"
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"max_step": 7}))
    with pytest.raises(ValueError, match="max_step: Extra inputs are not permitted"):
        load_train_config(typo)


def test_cli_trains_records_the_command_and_resumes(tmp_path, data_file, monkeypatch, capsys):
    config_file = tmp_path / "train.json"
    settings = _config(tmp_path, data_file).model_dump(mode="json")
    settings.pop("out"), settings.pop("run_dir")
    config_file.write_text(json.dumps(settings))
    out = tmp_path / "cli_model"
    parser = argparse.ArgumentParser(prog="sedd")
    train_command.register(parser.add_subparsers(dest="command"))
    argv = ["train", "--config", str(config_file), "--out", str(out), "--run-dir",
            str(tmp_path / "cli_run"), "--max-steps", "2", "--no-progress"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/sedd", *argv])

    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "trained steps 1..2" in capsys.readouterr().out
    recorded = load_checkpoint(out).config.provenance.training_command
    assert recorded is not None and recorded.startswith("sedd train --config ")

    args = parser.parse_args([*argv, "--resume"])
    assert args.func(args) == 0
    assert "already at step 2" in capsys.readouterr().out


def test_documented_command_chain_reproduces_the_weights_byte_for_byte(
    tmp_path, data_file, monkeypatch, capsys
):
    """The bundled model's recipe (train, then --resume with a larger --max-steps), each command
    a separate ``sedd train`` invocation (the CLI's ``main``, in-process), twice from nothing:
    identical model files. Before every command the global RNGs (torch, NumPy, ``random``) are
    reseeded differently, so a command must not depend on any state it finds in the process."""
    config_file = tmp_path / "train.json"
    settings = _config(tmp_path, data_file).model_dump(mode="json")
    settings.pop("out"), settings.pop("run_dir")
    config_file.write_text(json.dumps(settings))
    scramble = iter(range(101, 200))

    def recipe(name: str) -> str:
        common = ["train", "--config", str(config_file), "--out", str(tmp_path / name),
                  "--run-dir", str(tmp_path / f"{name}_run"), "--no-progress"]  # fmt: skip
        for extra in (["--max-steps", "2"], ["--resume", "--max-steps", "3"]):
            argv = [*common, *extra]
            monkeypatch.setattr(sys, "argv", ["sedd", *argv])
            seed = next(scramble)
            torch.manual_seed(seed)
            np.random.seed(seed)
            random.seed(seed)
            assert cli_main(argv) == 0, capsys.readouterr().err
        return sha256_file(tmp_path / name / "model.safetensors")

    first, second = recipe("first"), recipe("second")
    out = capsys.readouterr().out
    assert out.count("trained steps 1..2") == 2 and out.count("trained steps 3..3") == 2
    assert first == second
    assert load_checkpoint(tmp_path / "first").config.provenance.step == 3


def test_config_file_paths_are_relative_to_the_file_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anywhere but the repository
    root = Path(__file__).parents[2]
    shipped = load_train_config(root / "configs" / "pbmc_default_v2.json")  # the bundled recipe
    assert Path(shipped.data).is_file() and Path(shipped.data).name == "pbmc68k_counts.h5ad"
    assert Path(shipped.out).resolve() == (root / "models" / "pbmc_default").resolve()
    assert Path(shipped.init_from).resolve() == root / "models" / "pbmc_v1"
    assert load_checkpoint(shipped.init_from).config.provenance.step == 4700  # the v1 chain's end
    for first_model in ("pbmc_default.json", "pbmc_default_stage2.json"):  # the v1 chain
        assert Path(load_train_config(root / "configs" / first_model).out) == Path(
            shipped.init_from
        )
    assert Path(load_train_config().data).is_file()  # the default: the bundled counts
    nested = tmp_path / "configs" / "run.json"
    nested.parent.mkdir()
    nested.write_text(json.dumps({"data": "../cells.h5ad", "out": "model"}))
    config = load_train_config(nested, run_dir="state")  # a flag stays relative to the cwd
    assert (config.data, config.out, config.run_dir) == (
        str(tmp_path / "cells.h5ad"),
        str(nested.parent / "model"),
        "state",
    )
    assert load_train_config(nested).run_path == nested.parent / "model" / "training"


def test_init_from_starts_from_the_models_weights_and_records_it(tmp_path, data_file):
    """Fine-tuning: model and EMA start from the given model's weights (not a random init),
    the source and its hash go into provenance, and a resumed run keeps the record."""
    base = Trainer(_config(tmp_path, data_file, "base"), progress=False)
    base.fit()
    source = Path(base.config.out)
    weights = load_checkpoint(source).model.state_dict()

    config = _config(tmp_path, data_file, "tuned", init_from=str(source), max_steps=3)
    tuned = Trainer(config, progress=False)
    fresh = Trainer(_config(tmp_path, data_file, "fresh"), progress=False)
    for name, want in weights.items():
        assert torch.equal(tuned.model.state_dict()[name], want), name
        assert torch.equal(tuned.ema.model.state_dict()[name], want), name
    assert any(
        not torch.equal(fresh.model.state_dict()[name], want) for name, want in weights.items()
    )
    tuned.fit(until=1)
    record = {"source": str(source), "sha256": sha256_file(source / "model.safetensors")}
    assert load_checkpoint(config.out).config.provenance.model_dump()["init_from"] == record
    resumed = Trainer(config, resume=True, progress=False)
    resumed.fit()
    assert resumed.step == 3 and resumed.init_record == record
    assert load_checkpoint(config.out).config.provenance.model_dump()["init_from"] == record


def test_init_from_refuses_a_model_of_other_genes_labels_or_size(tmp_path, data_file):
    base = Trainer(_config(tmp_path, data_file, "base"), progress=False)
    base.fit(until=1)
    source = base.config.out
    wider = {"hidden_dim": 32, "num_layers": 1, "num_heads": 2}
    with pytest.raises(ValueError, match=r"init_from: .* has arch\.hidden_dim 16, but this run "):
        Trainer(_config(tmp_path, data_file, "w", init_from=source, arch=wider), progress=False)
    with pytest.raises(ValueError, match=r"has architecture st3_perturbation, but .* st3;"):
        Trainer(
            _config(tmp_path, data_file, "u", init_from=source, condition_key=None),
            progress=False,
        )
    renamed = anndata.read_h5ad(data_file)
    renamed.var_names = [f"other{i}" for i in range(N_GENES)]
    renamed.write_h5ad(tmp_path / "renamed.h5ad")
    with pytest.raises(ValueError, match=r"has genes 10 names \[gene0, gene1, gene2, ...\], but"):
        Trainer(_config(tmp_path, tmp_path / "renamed.h5ad", "g", init_from=source), progress=False)
    dropout_only = {"hidden_dim": 16, "num_layers": 1, "num_heads": 2, "dropout": 0.0}
    Trainer(_config(tmp_path, data_file, "d", init_from=source, arch=dropout_only), progress=False)


def test_the_v2_recipe_fine_tunes_reproducibly_across_an_interrupted_schedule(
    tmp_path, data_file, monkeypatch, capsys
):
    """The bundled v2 model's chain (models/pbmc_default/README.md): fine-tune from a model with
    bf16 autocast, stop at a step under a longer cosine, resume under a shorter one. Run twice
    from the same init, each command a fresh CLI call: identical model files, and the init and
    both commands are in the provenance."""
    base = Trainer(_config(tmp_path, data_file, "base"), progress=False)
    base.fit()
    config_file = tmp_path / "v2.json"
    settings = _config(tmp_path, data_file, amp="bf16").model_dump(mode="json")
    settings.pop("out"), settings.pop("run_dir")
    config_file.write_text(json.dumps(settings | {"init_from": base.config.out}))

    def recipe(name: str) -> str:
        common = ["train", "--config", str(config_file), "--out", str(tmp_path / name),
                  "--run-dir", str(tmp_path / f"{name}_run"), "--no-progress"]  # fmt: skip
        for extra in (["--max-steps", "6", "--until-step", "2"], ["--resume", "--max-steps", "4"]):
            argv = [*common, *extra]
            monkeypatch.setattr(sys, "argv", ["sedd", *argv])
            torch.manual_seed(len(name) + len(extra))  # state a command must not depend on
            assert cli_main(argv) == 0, capsys.readouterr().err
        return sha256_file(tmp_path / name / "model.safetensors")

    assert recipe("first") == recipe("second_run")
    provenance = load_checkpoint(tmp_path / "first").config.provenance.model_dump()
    assert provenance["step"] == 4 and provenance["init_from"]["source"] == base.config.out
    assert len(provenance["training_commands"]) == 2
    assert "trained steps 3..4" in capsys.readouterr().out
