"""st3's cell-type inference (branch mismatch-celltype, ``celltype_cond/``) as a drop-in:
``scripts/inference_celltype_perturbseq.py`` over the engine every other entry point uses.

Every flag and ``--config`` key of st3's script is a celltype row of
``sedd.commands.st3_flags.ST3_FLAGS``, with st3's defaults (``--num_samples_per_condition`` 100,
``--num_steps`` 50, ``--batch_size`` 32, ``--seed`` 42). One run generates one cell type
(``--cell_type``, or ``inference.cell_type``): for each perturbation asked for
(``--perturbations_file``, which wins as in st3, else ``--perturbations``, else every perturbation
of the model, control included, in the model's order), ``--num_samples_per_condition`` cells.
Perturbations the model does not know are warned about and skipped, as st3 skips them. st3's
layout::

    <output_dir or experiment_dir/inference_results>/celltype_<name>/   (spaces, / -> _)
        generated_cells.h5ad    obs: perturbation, cell_type (categorical), pert_idx,
                                celltype_idx (int64: the model's rows), generated (bool: True),
                                then sedd's columns; uns["sedd"]: provenance
        generation_config.json  st3's keys, in st3's order (json, indent 2)

and sedd's ``generation_metadata.json`` and ``generated_cells.metrics.json`` beside them.

Unlike st3, a run without a cell type is refused (st3 put every cell type in one file; here
``scripts/inference_all_celltypes.sh`` writes one folder each), and so is an unknown one (st3
printed an error and exited 0); both in one line, listing the model's cell types, before any
sampling. Cell types given as vectors (``--celltype_labels_pt_path``) are refused: sedd passes
them as indices. A result that exists is refused before sampling unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
from anndata.io import read_elem, write_elem

from sedd.checkpoints import LoadedModel
from sedd.commands.args import add_progress_argument
from sedd.commands.st3_flags import add_st3_flags
from sedd.commands.st3_outputs import refuse_early, write_result
from sedd.commands.st3_scripts import (
    _known,
    _load,
    _parse,
    _sampling_request,
    own_arguments,
)
from sedd.commands.st3_words import in_script_words
from sedd.io.files import write_bytes_atomic
from sedd.request.conditions import read_perturbation_file

RESULTS_DIR = "inference_results"
CELLS_FILE = "generated_cells.h5ad"
CONFIG_FILE = "generation_config.json"
ST3_OBS = ("perturbation", "cell_type", "pert_idx", "celltype_idx", "generated")
_CELL_TYPE = "--cell_type (job scripts: CELL_TYPE, or --cell_types of inference_all_celltypes.sh)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="inference_celltype_perturbseq.py", allow_abbrev=False,
        description="Generate perturbed cells of one cell type (st3 celltype_cond inference).",
    )  # fmt: skip
    add_st3_flags(p, "celltype")
    add_progress_argument(own_arguments(p, precision_help="default bf16"))
    return p


def celltype_folder(cell_type: str) -> str:
    """st3's folder of a cell type's result: ``celltype_`` + the name, spaces and / as _."""
    return "celltype_" + cell_type.replace(" ", "_").replace("/", "_")


def _cell_type_index(loaded: LoadedModel, args: argparse.Namespace) -> int:
    """The model's index of ``--cell_type``; one line naming the known ones when it is unset or
    unknown (or the model has no named cell types)."""
    known = list(loaded.config.cell_types or [])
    if not known:
        raise ValueError(f"--experiment_dir {args.experiment_dir} names no cell types (st3's "
                         "args.json lists them in cell_types): use a cell-type model, or "
                         "scripts/inference_conditional.py for this one.")  # fmt: skip
    shown = ", ".join(map(repr, known))
    if args.cell_type is None:
        raise ValueError(f"{_CELL_TYPE} is not set (nor inference.cell_type in --config): one run "
                         f"generates one cell type; pass one of {shown}. Nothing was "
                         "generated.")  # fmt: skip
    if args.cell_type not in known:
        raise ValueError(f"{_CELL_TYPE} {args.cell_type!r} is not a cell type of the model; pass "
                         f"one of {shown}. Nothing was generated.")  # fmt: skip
    return known.index(args.cell_type)


def _asked_for(args: argparse.Namespace) -> list[str] | None:
    """st3's choice: ``--perturbations_file``, else ``--perturbations`` (None: every one)."""
    listed, file = args.perturbations, args.perturbations_file
    if listed and file and not {"perturbations", "perturbations_file"} & args.from_yaml:
        raise ValueError(f"--perturbations {' '.join(listed)} and --perturbations_file {file} "
                         "both name the perturbations to generate; pass one of them.")  # fmt: skip
    if file:
        return read_perturbation_file(file)
    if isinstance(listed, str):  # inference.perturbations: "A B" in the YAML
        listed = re.split(r"[\s,]+", listed.strip())
    return [str(name) for name in listed] if listed else None


def _with_st3_obs(out: Path, celltype_idx: int) -> None:
    """Put st3's obs columns first in ``out``: perturbation, cell_type, pert_idx (sedd's
    ``condition_idx``, the model's label row), celltype_idx, generated; sedd's others follow."""
    with h5py.File(out, "r+") as file:
        obs = read_elem(file["obs"])
        n = len(obs)
        labels = obs["perturbation" if "perturbation" in obs else "condition"]
        st3 = pd.DataFrame(
            {
                "perturbation": labels.astype(str).astype("category"),
                "cell_type": obs["cell_type"].astype(str).astype("category"),
                "pert_idx": obs["condition_idx"].to_numpy(dtype=np.int64),
                "celltype_idx": np.full(n, celltype_idx, dtype=np.int64),
                "generated": np.ones(n, dtype=bool),
            },
            index=obs.index,
        )
        frame = pd.concat([st3, obs.drop(columns=[c for c in ST3_OBS if c in obs])], axis=1)
        # written beside the old obs first, so a failed write leaves that one in place
        write_elem(file, "obs_st3", frame)
        del file["obs"]
        file.move("obs_st3", "obs")


def _checkpoint_as_st3_says(
    args: argparse.Namespace, given: str | None, loaded: LoadedModel
) -> str:
    """st3's ``checkpoint`` entry: the path as given, else the one found in the experiment."""
    if given is not None:
        return str(Path(given))
    found = loaded.weights_file
    if found is None:
        return str(Path(args.experiment_dir))
    exp = Path(args.experiment_dir)
    return str(exp / found.name) if found.parent == exp.resolve() else str(found)


def inference_celltype_perturbseq(argv: Sequence[str] | None = None) -> int:
    args = _parse(_parser(), "celltype", argv)
    if args.celltype_labels_pt_path is not None:
        raise ValueError(f"--celltype_labels_pt_path {args.celltype_labels_pt_path}: sedd passes "
                         "cell types as indices (models trained on cell-type vectors do not "
                         "load); leave it unset (null in --config).")  # fmt: skip
    args.num_shards, args.shard_index = 1, 0  # one process: never a SLURM array task's shard
    args.sampler = "euler"  # st3's CellTypePerturbationEulerSampler
    base = Path(args.output_dir) if args.output_dir else Path(args.experiment_dir) / RESULTS_DIR
    if args.cell_type is not None:
        refuse_early(base / celltype_folder(args.cell_type) / CELLS_FILE, args)
    names, given_checkpoint = _asked_for(args), args.checkpoint
    loaded = _load(args)
    celltype_idx = _cell_type_index(loaded, args)
    out = base / celltype_folder(args.cell_type) / CELLS_FILE
    args.skipped_perturbations = []
    perturbations = list(loaded.conditions) if names is None else _known(loaded, names, args)
    request = _sampling_request(args, args.num_samples_per_condition, perturbations)
    config_file = out.parent / CONFIG_FILE
    extra = {"skipped_perturbations": args.skipped_perturbations, "st3_config": CONFIG_FILE}
    write_result(loaded, request, args, out, "inference_celltype_perturbseq", extra,
                 also=(config_file,))  # fmt: skip
    _with_st3_obs(out, celltype_idx)
    total = len(perturbations) * args.num_samples_per_condition
    st3_config = {
        "experiment_dir": str(Path(args.experiment_dir)),
        "checkpoint": _checkpoint_as_st3_says(args, given_checkpoint, loaded),
        "cell_type": args.cell_type,
        "target_cell_types": [args.cell_type],
        "num_perturbations": len(perturbations),
        "num_samples_per_condition": args.num_samples_per_condition,
        "num_steps": args.num_steps,
        "temperature": args.temperature,
        "total_samples": total,
        "seed": args.seed,
    }
    write_bytes_atomic(config_file, json.dumps(st3_config, indent=2).encode())
    print(f"cell type {args.cell_type!r}: {len(perturbations)} perturbations x "
          f"{args.num_samples_per_condition} cells = {total}; results in {out.parent}")  # fmt: skip
    return 0


def celltype_main() -> None:
    """The script's entry: a user error is one line naming the script's own flags, exit 2."""
    try:
        code = inference_celltype_perturbseq(None)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        message = re.sub(r"`?cells_per_condition`?", "--num_samples_per_condition", str(exc))
        print(f"{Path(sys.argv[0]).name}: error: {in_script_words(message, 'celltype')}",
              file=sys.stderr)  # fmt: skip
        code = 2
    raise SystemExit(code)


def list_cell_types(argv: Sequence[str] | None = None) -> int:
    """``python -m sedd.commands.st3_celltype --experiment_dir DIR``: the model's cell types,
    one a line (what ``scripts/inference_all_celltypes.sh`` runs when no --cell_types are
    given; st3's read args.json's cell_types)."""
    p = argparse.ArgumentParser(prog="python -m sedd.commands.st3_celltype", allow_abbrev=False)
    p.add_argument("--experiment_dir", required=True)
    p.add_argument("--checkpoint", default=None)
    args = p.parse_args(argv)
    args.genes, args.device = None, "cpu"
    with warnings.catch_warnings():  # gene names do not matter here
        warnings.simplefilter("ignore")
        loaded = _load(args)
    known = list(loaded.config.cell_types or [])
    if not known:
        raise ValueError(f"--experiment_dir {args.experiment_dir} names no cell types; pass "
                         "--cell_types NAME ... for a cell-type model.")  # fmt: skip
    print("\n".join(known))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(list_cell_types())
    except ValueError as exc:
        print(f"inference_all_celltypes.sh: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
