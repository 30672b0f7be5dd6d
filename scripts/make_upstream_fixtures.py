"""Write tests/data/upstream/: tiny checkpoints of two upstream model families, saved as their own
trainers save them, with the log-scores their own code computes for fixed inputs.

* aivc-dcm (``--dcm-src``, a tree holding ``<tree>/src/sedd/model.py`` or ``<tree>/sedd/model.py``):
  ``SEDDPerturbationTransformerSeparateFiLM`` (+ sizes) and the summed
  ``SEDDPerturbationTransformer`` (+ sizes), chosen by ``model_name`` in args.json.
* st3's cell-type family (``--st3-celltype-src``, a tree of kleonlab/st3 branch
  mismatch-celltype, holding ``<tree>/sedd/model.py`` and ``<tree>/celltype_cond/sedd/model.py``):
  ``SEDDCellTypePerturbationTransformer{Small,Medium,Large}``, chosen by ``model_size``.

The upstream model files are imported from those trees here, at generation time only: each is
loaded as a module of its own (both projects call their package ``sedd``, as we do), so nothing
of their packages besides ``model.py`` runs. The random weights are drawn far wider than
upstream's N(0, 0.02) init, so the outputs are far from uniform and depend strongly on time,
perturbation and cell type; the script asserts it, so a loader that drops a signal fails parity.

    python scripts/make_upstream_fixtures.py --dcm-src DIR --st3-celltype-src DIR [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

NUM_GENES, NUM_BINS = 48, 12  # vocabulary 13, mask token 12
HIDDEN, LAYERS, HEADS, DROPOUT = 16, 2, 4, 0.1  # ~70 KiB a checkpoint
PERTURBATIONS = ["non-targeting", "STAT1", "IRF1", "JAK1", "MYC"]  # in first-seen order
CELL_TYPES = ["B", "Mono", "T"]  # sorted, as np.unique gives them
VECTOR_DIM = 8  # stand-in for 320-d ESM2 vectors
EPS = 1e-3  # the log-linear schedule both projects train with
MIN_EFFECT = 0.1  # outputs must move this much when one conditioning input changes


def load_module(name: str, path: Path) -> types.ModuleType:
    """Import one upstream file as module ``name`` (not through its package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_file(root: Path, *candidates: str) -> Path:
    for candidate in candidates:
        if (root / candidate).is_file():
            return root / candidate
    raise SystemExit(f"{root} holds none of {', '.join(candidates)}; pass the upstream tree.")


def dcm_models(root: Path) -> types.ModuleType:
    return load_module("dcm_model", first_file(root, "src/sedd/model.py", "sedd/model.py"))


def st3_celltype_models(root: Path) -> types.ModuleType:
    """``<tree>/celltype_cond/sedd/model.py`` does ``from sedd.model import ...``: serve it
    st3's base model file under that name while it imports, then put back whatever ``sedd``
    was."""
    base = load_module("st3_model", first_file(root, "sedd/model.py"))
    saved = {key: sys.modules.get(key) for key in ("sedd", "sedd.model")}
    package = types.ModuleType("sedd")
    package.__path__ = []  # a package with no files: only sedd.model below resolves
    sys.modules["sedd"], sys.modules["sedd.model"] = package, base
    try:
        return load_module("st3_celltype_model", first_file(root, "celltype_cond/sedd/model.py"))
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module


def widen(model: nn.Module, seed: int) -> nn.Module:
    """Weights far from upstream's N(0, 0.02) init: Linear ~ N(0, 1/fan_in) with N(0, 0.1)
    biases, embeddings and the output projection ~ N(0, 0.5)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Embedding) or name == "out_proj":
                module.weight.normal_(0.0, 0.5, generator=generator)
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5, generator=generator)
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.1, generator=generator)
    return model.eval()


def fixed_inputs() -> dict[str, torch.Tensor]:
    """Four rows: masked fractions 0, 0.3, 0.7, 1 at times 0.05 .. 0.95."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, NUM_BINS, (4, NUM_GENES), generator=generator)
    for row, fraction in enumerate((0.0, 0.3, 0.7, 1.0)):
        masked = torch.rand(NUM_GENES, generator=generator) < fraction
        x[row, masked] = NUM_BINS
    t = torch.tensor([0.05, 0.3, 0.6, 0.95])
    vectors = torch.randn(len(PERTURBATIONS), VECTOR_DIM, generator=generator)
    pert_labels = torch.tensor([0, 1, 3, 4])
    return {
        "x": x,
        "t": t,
        "sigma": -torch.log1p(-(1 - EPS) * t),  # total noise of the log-linear schedule
        "pert_labels": pert_labels,
        "cell_type_labels": torch.tensor([0, 2, 1, 2]),
        "pert_vec": vectors[pert_labels],
        "vectors": vectors,
    }


def args_payload(keys: list[str], model_args: dict[str, Any]) -> dict[str, Any]:
    """vars(args) of an upstream trainer with every argument at a stand-in value, then the keys
    it adds itself (``model_args``)."""
    stand_ins: dict[str, Any] = {
        "config": "configs/perturbseq_small.yaml",
        "train_data_path": "data/train.h5ad",
        "gene": "gene",
        "cell_type_col": "cell_type",
        "control_name": PERTURBATIONS[0],
        "val_fraction": 0.1,
        "loader_path": None,
        "cond_labels_pt_path": None,
        "celltype_labels_pt_path": None,
        "all_perturbations_file": None,
        "hidden_dim": HIDDEN,
        "num_layers": LAYERS,
        "num_heads": HEADS,
        "dropout": DROPOUT,
        "batch_size": 8,
        "num_epochs": 1,
        "learning_rate": 1e-4,
        "weight_decay": 0.01,
        "mask_ratio": 0.15,
        "gradient_clip": 1.0,
        "use_amp": False,
        "amp_dtype": "bfloat16",
        "checkpoint_dir": "experiments/fixture",
        "save_interval": 2,
        "resume": None,
        "log_interval": 5,
        "val_interval": 1,
        "seed": 42,
        "num_workers": 0,
    }
    return {key: stand_ins.get(key) for key in keys} | model_args


# The arguments each trainer's parser defines, in its order (vars(args) keeps it).
DCM_ARGS = [
    "config",
    "train_data_path",
    "gene",
    "control_name",
    "val_fraction",
    "loader_path",
    "cond_labels_pt_path",
    "all_perturbations_file",
    "model_name",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "dropout",
    "batch_size",
    "num_epochs",
    "learning_rate",
    "weight_decay",
    "mask_ratio",
    "gradient_clip",
    "use_amp",
    "amp_dtype",
    "checkpoint_dir",
    "save_interval",
    "resume",
    "log_interval",
    "val_interval",
    "seed",
    "num_workers",
]
ST3_CELLTYPE_ARGS = [
    "config",
    "train_data_path",
    "gene",
    "cell_type_col",
    "control_name",
    "val_fraction",
    "loader_path",
    "cond_labels_pt_path",
    "celltype_labels_pt_path",
    "model_size",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "dropout",
    "batch_size",
    "num_epochs",
    "learning_rate",
    "weight_decay",
    "mask_ratio",
    "gradient_clip",
    "checkpoint_dir",
    "save_interval",
    "resume",
    "log_interval",
    "val_interval",
    "seed",
    "num_workers",
]


def save_experiment(exp_dir: Path, model: nn.Module, args: dict[str, Any]) -> None:
    """What the upstream trainers leave: args.json and final.pt (their save_checkpoint dict)."""
    (exp_dir / "args.json").write_text(json.dumps(args, indent=2, default=str))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args["learning_rate"])
    checkpoint = {
        "model_state_dict": model.state_dict(),
        "optimizer_state_dict": optimizer.state_dict(),
        "step": 0,
        "epoch": 0,
        "best_loss": float("inf"),
        "history": {"train_loss": [], "val_loss": []},
    }
    torch.save(checkpoint, exp_dir / "final.pt")


Score = Callable[..., torch.Tensor]


def check_conditioning(name: str, score: Score, io: dict[str, torch.Tensor], **given: Any) -> None:
    """Fail unless the output is far from uniform and moves with each conditioning input."""
    base = score(io["sigma"], **given)
    uniform = -math.log(NUM_BINS + 1)
    if (base - uniform).abs().max() < 1.0:
        raise SystemExit(f"{name}: log-scores are close to uniform; widen the weights.")
    changes = {"sigma": io["sigma"].flip(0)}
    for key, value in given.items():
        if value is not None:
            changes[key] = value.roll(1, 0)
    for key, value in changes.items():
        moved = (
            score(value, **given) if key == "sigma" else score(io["sigma"], **given | {key: value})
        )
        effect = float((moved - base).abs().max())
        if effect <= MIN_EFFECT:
            raise SystemExit(f"{name}: changing {key} moves the log-scores by {effect:.3g} only.")


def make_dcm(mod: types.ModuleType, out: Path, io: dict[str, torch.Tensor]) -> dict[str, Any]:
    outputs: dict[str, torch.Tensor] = {}
    cell_type_to_idx = {name: i for i, name in enumerate(CELL_TYPES)}
    specs = [
        # (directory, model_name, vector labels?, cell types?)
        ("dcm_film_ct", "SEDDPerturbationTransformerSeparateFiLMSmall", False, True),
        ("dcm_film_vec", "SEDDPerturbationTransformerSeparateFiLM", True, False),
        ("dcm_pert", "SEDDPerturbationTransformerMedium", False, True),
    ]
    for seed, (directory, model_name, vectors, cell_types) in enumerate(specs, start=10):
        model = getattr(mod, model_name)(
            num_genes=NUM_GENES,
            num_bins=NUM_BINS,
            num_perturbations=len(PERTURBATIONS),
            hidden_dim=HIDDEN,
            num_layers=LAYERS,
            num_heads=HEADS,
            dropout=DROPOUT,
            max_seq_len=NUM_GENES,  # as train_perturbseq.py builds it
            precomputed_emb_dim=VECTOR_DIM if vectors else None,
            num_cell_types=len(CELL_TYPES) if cell_types else None,
        )
        widen(model, seed)
        labels = io["pert_vec"] if vectors else io["pert_labels"]
        ct = io["cell_type_labels"] if cell_types else None

        def score(sigma: torch.Tensor, *, model: nn.Module = model, **given: Any) -> torch.Tensor:
            return model.score(io["x"], sigma, given["labels"], cell_type_labels=given["ct"])

        check_conditioning(directory, score, io, labels=labels, ct=ct)
        outputs[f"{directory}_score"] = score(io["sigma"], labels=labels, ct=ct)
        if cell_types:
            outputs[f"{directory}_score_no_ct"] = score(io["sigma"], labels=labels, ct=None)
        extra = {
            "num_genes": NUM_GENES,
            "num_bins": NUM_BINS,
            "num_perturbations": len(PERTURBATIONS),
            "vocab_size": NUM_BINS + 1,
            "num_cell_types": len(CELL_TYPES) if cell_types else 0,
            "cell_type_to_idx": cell_type_to_idx if cell_types else {},
        }
        args = args_payload(DCM_ARGS, {"model_name": model_name}) | extra
        exp_dir = out / directory
        exp_dir.mkdir(parents=True, exist_ok=True)
        if vectors:
            save_vectors(exp_dir, io, args)
        else:  # st3's side file naming label index i on line i
            (exp_dir / "perturbation_names_all.txt").write_text("\n".join(PERTURBATIONS) + "\n")
        save_experiment(exp_dir, model, args)
    return outputs


def save_vectors(exp_dir: Path, io: dict[str, torch.Tensor], args: dict[str, Any]) -> None:
    """The {name: vector} file the trainers read from --cond_labels_pt_path."""
    torch.save(dict(zip(PERTURBATIONS, io["vectors"], strict=True)), exp_dir / "vectors.pt")
    args["cond_labels_pt_path"] = "vectors.pt"


def make_st3_celltype(
    mod: types.ModuleType, out: Path, io: dict[str, torch.Tensor]
) -> dict[str, Any]:
    outputs: dict[str, torch.Tensor] = {}
    specs = [("st3_celltype", "small", False), ("st3_celltype_vec", "medium", True)]
    for seed, (directory, size, vectors) in enumerate(specs, start=20):
        model_class = getattr(mod, f"SEDDCellTypePerturbationTransformer{size.capitalize()}")
        model = model_class(
            num_genes=NUM_GENES,
            num_bins=NUM_BINS,
            num_perturbations=len(PERTURBATIONS),
            num_cell_types=len(CELL_TYPES),
            hidden_dim=HIDDEN,
            num_layers=LAYERS,
            num_heads=HEADS,
            dropout=DROPOUT,
            max_seq_len=NUM_GENES,  # as train_celltype_perturbseq.py builds it
            precomputed_pert_emb_dim=VECTOR_DIM if vectors else None,
            precomputed_celltype_emb_dim=None,
        )
        widen(model, seed)
        labels = io["pert_vec"] if vectors else io["pert_labels"]

        def score(sigma: torch.Tensor, *, model: nn.Module = model, **given: Any) -> torch.Tensor:
            return model.score(io["x"], sigma, given["labels"], given["ct"])

        check_conditioning(directory, score, io, labels=labels, ct=io["cell_type_labels"])
        outputs[f"{directory}_score"] = score(io["sigma"], labels=labels, ct=io["cell_type_labels"])
        extra = {
            "num_genes": NUM_GENES,
            "num_bins": NUM_BINS,
            "num_perturbations": len(PERTURBATIONS),
            "num_cell_types": len(CELL_TYPES),
            "vocab_size": NUM_BINS + 1,
            "cell_types": CELL_TYPES,
            "perturbations": PERTURBATIONS,
        }
        args = args_payload(ST3_CELLTYPE_ARGS, {"model_size": size}) | extra
        exp_dir = out / directory
        exp_dir.mkdir(parents=True, exist_ok=True)
        if vectors:
            save_vectors(exp_dir, io, args)
        save_experiment(exp_dir, model, args)
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dcm-src", type=Path, required=True, help="aivc-dcm source tree")
    parser.add_argument(
        "--st3-celltype-src", type=Path, required=True, help="st3 tree, branch mismatch-celltype"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/upstream"
    )
    opts = parser.parse_args(argv)
    torch.manual_seed(0)
    io = fixed_inputs()
    with torch.no_grad():  # fp32 on the CPU: autocast is off unless entered
        outputs = make_dcm(dcm_models(opts.dcm_src), opts.out, io)
        outputs |= make_st3_celltype(st3_celltype_models(opts.st3_celltype_src), opts.out, io)
    inputs = {k: v for k, v in io.items() if k != "vectors"}
    torch.save(inputs | outputs, opts.out / "io_fixture.pt")
    total = sum(p.stat().st_size for p in opts.out.rglob("*") if p.is_file())
    print(f"wrote {opts.out} ({total / 1024:.0f} KiB): {', '.join(sorted(outputs))}")


if __name__ == "__main__":
    main()
