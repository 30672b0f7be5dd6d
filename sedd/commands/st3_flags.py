"""Every flag st3's inference scripts define, and its ``--config`` YAML, in one table.

``ST3_FLAGS`` lists each flag of st3's ``scripts/inference_conditional.py`` and
``scripts/inference_generation.py`` (both of its versions: the ``--data_path`` comparison one and
the ``--reference_data``/``--output_path`` one) with what it means here. A flag is one of:

- ``honoured``: it does what it does in st3 (the help says how);
- ``noted``: st3 parses it and uses it only for its plots or prints, or not at all; accepted, and
  one line says it changes nothing here.

``read_st3_config`` reads a ``--config`` YAML as st3 does: sections ``data``, ``inference`` and
``other``; a key's value becomes that flag's default, so the command line still wins (st3's
precedence: command line > YAML > the script's default). A missing file is an error (st3 raises
too); keys no flag reads (st3 shares one YAML between training and inference) are listed once.

The parsers use ``allow_abbrev=False``: st3's ``--gene`` must never be taken for ``--genes``,
nor ``--perturbations`` for ``--perturbations_file``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sedd.defaults import CELLS_PER_PERTURBATION, PREDICTORS

Script = Literal["conditional", "generation", "perturbseq", "imputation", "celltype"]
COND: frozenset[Script] = frozenset({"conditional", "perturbseq"})
GEN: frozenset[Script] = frozenset({"generation"})
ALL: frozenset[Script] = COND | GEN
PERTURBSEQ: frozenset[Script] = frozenset({"perturbseq"})
IMPUTATION: frozenset[Script] = frozenset({"imputation"})  # its own rows, at the end
CELLTYPE: frozenset[Script] = frozenset({"celltype"})  # the last rows
ST3_SEED = 42  # st3's scripts: `--seed` default 42 (and the YAML's other.seed)


@dataclass(frozen=True)
class St3Flag:
    """One st3 flag: where st3 defines it, the YAML key that sets it, and what it does here."""

    flag: str
    scripts: frozenset[Script]
    kwargs: Mapping[str, Any]
    yaml: tuple[tuple[str, str], ...] = ()  # (section, key), first found wins
    noted: str | None = None  # why accepting it changes nothing here
    dest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dest", self.flag.lstrip("-"))


def _path(help_: str) -> dict[str, Any]:
    return {"default": None, "metavar": "PATH", "help": help_}


ST3_FLAGS: tuple[St3Flag, ...] = (
    St3Flag("--config", ALL, _path("st3 YAML: sections data, inference, other set defaults")),
    St3Flag("--experiment_dir", ALL, {"required": True, "help": "st3 experiment or model"}),
    St3Flag(
        "--checkpoint",
        ALL,
        _path(
            "checkpoint file, as given (relative to the working directory, as in st3), else a "
            "name inside --experiment_dir; default best.pt > final.pt > newest epoch_N.pt"
        ),
    ),
    St3Flag(
        "--perturbations_file",
        COND,
        _path("perturbations to generate, one a line (default: every label of the model)"),
        (("inference", "perturbations_file"),),
    ),
    St3Flag(
        "--perturbations_all_file",
        COND,
        _path(
            "every perturbation in training order: control is index 0, the others follow "
            "(where the model has a {name: index} file, that file gives the indices; job "
            "scripts: PERTURBATIONS_ALL_FILE)"
        ),
        (("inference", "perturbations_all_file"), ("data", "all_perturbations_file")),
    ),
    St3Flag(
        "--perturbations",
        COND,
        {
            "nargs": "+",
            "default": None,
            "metavar": "NAME",
            "help": "perturbations to generate, named on the command line",
        },
    ),
    St3Flag(
        "--test_data_path",
        COND,
        _path("h5ad of held-out real cells: with --evaluate, `sedd evaluate` compares to it"),
        (("data", "test_data_path"),),
    ),
    St3Flag(
        "--mapping_data_path",
        COND,
        _path(
            "st3: h5ad whose labels gave the index mapping (noted: the mapping comes from "
            "--perturbations_all_file or the model's names file)"
        ),
        (("data", "mapping_data_path"), ("data", "train_data_path")),
        noted="the label order comes from --perturbations_all_file or the model's names file",
    ),
    St3Flag(
        "--cond_labels_pt_path",
        COND,
        _path("perturbation vectors {name: tensor} of a vector-conditioned model"),
        (("data", "cond_labels_pt_path"),),
    ),
    St3Flag(
        "--gene",
        COND,
        {
            "default": "perturbation",
            "metavar": "COLUMN",
            "help": "obs column of the labels in --test_data_path (default perturbation); the "
            "generated cells' column is always perturbation",
        },
        (("data", "gene"),),
    ),
    St3Flag(
        "--control_name",
        COND,
        {"default": None, "help": "the control label (default: the model's own)"},
        (("data", "control_name"),),
    ),
    St3Flag(
        "--num_samples_per_pert",
        COND,
        {
            "type": int,
            "default": CELLS_PER_PERTURBATION,
            "help": f"cells per perturbation (default {CELLS_PER_PERTURBATION}, st3's)",
        },
        (("inference", "num_samples_per_pert"),),
    ),
    St3Flag(
        "--num_generate",
        GEN,
        {"type": int, "default": 100, "help": "cells to generate (default 100, st3's)"},
        (("inference", "num_generate"),),
    ),
    St3Flag(
        "--num_steps",
        COND,
        {"type": int, "default": 50, "help": "reverse diffusion steps (default 50, st3's)"},
        (("inference", "num_steps"),),
    ),
    St3Flag(
        "--num_steps",
        GEN,
        {"type": int, "default": 100, "help": "reverse diffusion steps (default 100, st3's)"},
        (("inference", "num_steps"),),
    ),
    St3Flag(
        "--temperature",
        ALL,
        {"type": float, "default": 1.0, "help": "sampling temperature (default 1.0)"},
        (("inference", "temperature"),),
    ),
    St3Flag(
        "--seed",
        ALL,
        {
            "type": int,
            "default": ST3_SEED,
            "help": f"cell i draws from the random stream (seed, i) (default {ST3_SEED}, st3's)",
        },
        (("other", "seed"),),
    ),
    St3Flag(
        "--evaluate",
        COND,
        {"action": "store_true", "help": "then run `sedd evaluate` against --test_data_path"},
    ),
    St3Flag(
        "--sampler",
        ALL,
        {
            "choices": list(PREDICTORS),
            "default": "euler",
            "help": "reverse step: euler (st3's), analytic (DCM's configs) or entropy",
        },
        (("inference", "sampler"),),
    ),
    St3Flag(
        "--batch_size",
        ALL,
        {"type": int, "default": 64, "help": "cells in flight (default 64; never changes a cell)"},
        (("inference", "batch_size"),),
    ),
    St3Flag(
        "--num_batches",
        PERTURBSEQ,
        {"type": int, "default": None, "help": "st3: test batches to predict (noted)"},
        (("inference", "num_batches"),),
        noted="--num_samples_per_pert cells are predicted for every held-out perturbation",
    ),
    St3Flag(
        "--data_path",
        PERTURBSEQ,
        _path("st3's name for the held-out real cells (the same as --reference_data)"),
        (("data", "test_data_path"),),
    ),
    St3Flag(
        "--val_fraction",
        PERTURBSEQ,
        {"type": float, "default": None, "help": "st3's split of --data_path (noted)"},
        (("data", "val_fraction"),),
        noted="the held-out cells are obs[--split_key] == --split_value of --data_path",
    ),
    St3Flag(
        "--use_train_split",
        PERTURBSEQ,
        {"action": "store_true", "help": "st3's split of --data_path (noted)"},
        noted="the held-out cells are obs[--split_key] == --split_value of --data_path",
    ),
    St3Flag(
        "--num_workers",
        COND,
        {"type": int, "default": None, "help": "st3's data loader workers (noted)"},
        (("other", "num_workers"),),
        noted="the cells are read in-process",
    ),
    St3Flag(
        "--num_cells_visualize",
        ALL,
        {"type": int, "default": None, "help": "st3's plots (noted: none are drawn here)"},
        (("inference", "num_cells_visualize"),),
        noted="no plots are drawn here; `sedd evaluate` draws them",
    ),
    St3Flag(
        "--reference_data",
        GEN,
        _path("h5ad whose var_names name the genes (st3 copies var from it)"),
        (("inference", "reference_data"),),
    ),
    St3Flag(
        "--output_path",
        GEN,
        _path("the h5ad to write (default <experiment_dir>/inference/generated_cells.h5ad)"),
        (("inference", "output_path"),),
    ),
    St3Flag(
        "--keep_sparse",
        GEN,
        {"action": "store_true", "help": "keep X sparse (X is always sparse CSR counts)"},
        (("inference", "keep_sparse"),),
        noted="X is always written as sparse CSR counts",
    ),
    St3Flag(
        "--data_path",
        GEN,
        _path("st3 (older version): real cells for its comparison plots (noted)"),
        noted="st3 compared against it in plots; use `sedd evaluate --real` for that",
    ),
    St3Flag(
        "--val_fraction",
        GEN,
        {"type": float, "default": None, "help": "st3's comparison split (noted)"},
        noted="it split --data_path for st3's comparison plots",
    ),
    St3Flag(
        "--use_train_split",
        GEN,
        {"action": "store_true", "help": "st3's comparison split (noted)"},
        noted="it chose st3's comparison split",
    ),
    St3Flag(
        "--num_real_visualize",
        GEN,
        {"type": int, "default": None, "help": "st3's plots (noted)"},
        noted="no plots are drawn here; `sedd evaluate` draws them",
    ),
    # scripts/inference_imputation.py (sedd.commands.st3_imputation): st3's defaults and keys
    St3Flag("--config", IMPUTATION, _path("st3 YAML: sections data, inference, other")),
    St3Flag("--experiment_dir", IMPUTATION, {"required": True, "help": "st3 experiment or model"}),
    St3Flag("--checkpoint", IMPUTATION, _path("checkpoint (default best.pt > final.pt > epoch)")),
    St3Flag("--data_path", IMPUTATION, _path("h5ad of real counts to mask and impute"),
            (("data", "data_path"),)),
    St3Flag("--val_fraction", IMPUTATION, {"type": float, "default": 0.1, "help": "the held-out "
            "fraction (st3's seeded split) imputed (default 0.1)"}, (("data", "val_fraction"),)),
    St3Flag("--use_train_split", IMPUTATION, {"action": "store_true", "help": "impute the rest"}),
    St3Flag("--mask_ratio", IMPUTATION, {"type": float, "default": 0.2, "help": "fraction of "
            "entries hidden and imputed, in (0, 1] (default 0.2)"}, (("inference", "mask_ratio"),)),
    St3Flag("--num_steps", IMPUTATION, {"type": int, "default": 50, "help": "steps (default 50)"},
            (("inference", "num_steps"),)),
    St3Flag("--temperature", IMPUTATION, {"type": float, "default": 1.0, "help": "default 1.0"},
            (("inference", "temperature"),)),
    St3Flag("--sampler", IMPUTATION, {"choices": list(PREDICTORS), "default": "euler",
            "help": "st3 has euler only"}, (("inference", "sampler"),)),
    St3Flag("--batch_size", IMPUTATION, {"type": int, "default": 32, "help": "cells a batch "
            "(default 32)"}, (("inference", "batch_size"),)),
    St3Flag("--num_batches", IMPUTATION, {"type": int, "default": None, "help": "impute the "
            "first N batches only (default all)"}, (("inference", "num_batches"),)),
    St3Flag("--num_cells_visualize", IMPUTATION, {"type": int, "default": 3, "help": "cells with "
            "cell_<i>_acc.txt/_mae.json (default 3)"}, (("inference", "num_cells_visualize"),)),
    St3Flag("--seed", IMPUTATION, {"type": int, "default": ST3_SEED, "help": "split, mask and "
            f"sampling seed (default {ST3_SEED})"}, (("other", "seed"),)),
    St3Flag("--num_workers", IMPUTATION, {"type": int, "default": 4, "help": "st3's loader "
            "(noted)"}, (("other", "num_workers"),), noted="the cells are read in-process"),
    # celltype_cond/scripts/inference_celltype_perturbseq.py (sedd.commands.st3_celltype)
    St3Flag("--config", CELLTYPE, _path("st3 YAML: sections data, inference, other")),
    St3Flag("--experiment_dir", CELLTYPE, {"required": True, "help": "st3 experiment or model"}),
    St3Flag("--checkpoint", CELLTYPE, _path("checkpoint (default best.pt > final.pt > epoch)")),
    St3Flag("--data_path", CELLTYPE, _path("st3: test cells (noted: its script reads none)"),
            (("data", "data_path"), ("data", "test_data_path")),
            noted="st3's cell-type script reads no cells, nor does this one"),
    St3Flag("--gene", CELLTYPE, {"default": "gene", "help": "st3: label column of --data_path "
            "(noted)"}, (("data", "gene"),), noted="the generated cells' column is perturbation"),
    St3Flag("--cell_type_col", CELLTYPE, {"default": "cell_type", "help": "st3: cell-type column "
            "of --data_path (noted)"}, (("data", "cell_type_col"),),
            noted="the generated cells' column is cell_type"),
    St3Flag("--control_name", CELLTYPE, {"default": "non-targeting", "help": "st3 parses it "
            "(noted)"}, (("data", "control_name"),),
            noted="the control is generated where it is listed, as in st3"),
    St3Flag("--cell_type", CELLTYPE, {"default": None, "help": "the cell type every cell is "
            "generated for; the result goes to <output_dir>/celltype_<name>/"},
            (("inference", "cell_type"),)),
    St3Flag("--perturbations", CELLTYPE, {"nargs": "+", "default": None, "metavar": "NAME",
            "help": "perturbations to generate (default: every one of the model, control "
            "included)"}, (("inference", "perturbations"),)),
    St3Flag("--perturbations_file", CELLTYPE, _path("perturbations, one a line (wins over "
            "--perturbations, as in st3)"), (("inference", "perturbations_file"),)),
    St3Flag("--num_samples_per_condition", CELLTYPE, {"type": int, "default": 100, "help": "cells "
            "per perturbation (default 100)"}, (("inference", "num_samples_per_condition"),)),
    St3Flag("--num_steps", CELLTYPE, {"type": int, "default": 50, "help": "steps (default 50)"},
            (("inference", "num_steps"),)),
    St3Flag("--temperature", CELLTYPE, {"type": float, "default": 1.0, "help": "default 1.0"},
            (("inference", "temperature"),)),
    St3Flag("--batch_size", CELLTYPE, {"type": int, "default": 32, "help": "cells in flight "
            "(default 32; never changes a cell)"}, (("inference", "batch_size"),)),
    St3Flag("--output_dir", CELLTYPE, _path("default <experiment_dir>/inference_results; the "
            "result goes to its celltype_<name>/"), (("inference", "output_dir"),)),
    St3Flag("--save_h5ad", CELLTYPE, {"action": "store_true", "default": True, "help": "st3's "
            "switch, on by default (noted)"}, (("inference", "save_h5ad"),),
            noted="generated_cells.h5ad is always written"),
    St3Flag("--cond_labels_pt_path", CELLTYPE, _path("perturbation vectors {name: tensor} of a "
            "vector-conditioned model"), (("data", "cond_labels_pt_path"),)),
    St3Flag("--celltype_labels_pt_path", CELLTYPE, _path("st3: cell-type vectors (refused when "
            "set: cell types are passed as indices here)"), (("data", "celltype_labels_pt_path"),)),
    St3Flag("--seed", CELLTYPE, {"type": int, "default": ST3_SEED, "help": "cell i draws from "
            f"the random stream (seed, i) (default {ST3_SEED})"}, (("other", "seed"),)),
)


def flags_for(script: Script) -> list[St3Flag]:
    return [f for f in ST3_FLAGS if script in f.scripts]


def add_st3_flags(p: argparse.ArgumentParser, script: Script) -> None:
    for f in flags_for(script):
        p.add_argument(f.flag, dest=f.dest, **f.kwargs)


def notes_for(script: Script, given: set[str]) -> list[str]:
    """One line per noted flag that was set (on the command line or by the YAML)."""
    return [
        f"{f.flag}: accepted for st3 compatibility; {f.noted}."
        for f in flags_for(script)
        if f.noted and f.dest in given
    ]
