"""Where the st3-compatible scripts write, and how: st3's file names, ``generation_metadata.json``
beside the cells, no result replaced without ``--overwrite`` (checked before sampling), and a
sharded run's shards for ``sedd merge``. ``write_result`` is the one writer of
``scripts/inference_*.py``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sedd.checkpoints import LoadedModel
from sedd.commands.output import (
    check_h5ad_name,
    claim_output,
    run_shard,
    settings_from_args,
    write_one_file,
)
from sedd.io.files import refuse_existing, write_json_atomic
from sedd.request.plan import GenerationRequest, plan
from sedd.shards.ranges import Shard, resolve_shard

METADATA = "generation_metadata.json"
OVERWRITE = "--overwrite (job scripts: OVERWRITE=1)"


def shard_of(args: argparse.Namespace) -> Shard:
    return resolve_shard(args.num_shards, args.shard_index)


def metadata_path(out: Path) -> Path:
    """st3's ``generation_metadata.json`` beside ``generated_cells.h5ad``; beside a file named
    otherwise (``--output_path``), ``<stem>.generation_metadata.json``."""
    if out.name == "generated_cells.h5ad":
        return out.parent / METADATA
    return out.with_name(f"{out.stem}.{METADATA}")


def refuse_early(out: Path, args: argparse.Namespace) -> Path:
    """``out``, or the refusal to replace it (or to name it other than .h5ad), before the model
    is even loaded."""
    check_h5ad_name(out, "--output_path")
    refuse_existing(out, overwrite=args.overwrite, flag=OVERWRITE)
    return out


def claim(out: Path, args: argparse.Namespace, also: tuple[Path, ...] = ()) -> None:
    """Before any sampling: refuse when ``out`` holds an earlier run's cells (unless
    ``--overwrite``); when it does and may be replaced, the records that describe the old cells
    go first, so no moment leaves metadata of one run beside the cells of another."""
    claim_output(out, args.overwrite, flag="--output_path", overwrite_flag=OVERWRITE,
                 also=(metadata_path(out), *also))  # fmt: skip


_SHARD_FLAGS = ("--num-shards", "--num_shards", "--shard-index", "--shard_index")


def run_argv() -> list[str]:
    """The command line without the shard flags (the same for every shard of a run)."""
    argv, words = [], iter(sys.argv[1:])
    for word in words:
        if word in _SHARD_FLAGS:
            next(words, None)  # its value
        elif word.split("=", 1)[0] not in _SHARD_FLAGS:
            argv.append(word)
    return argv


def write_result(
    loaded: LoadedModel,
    request: GenerationRequest,
    args: argparse.Namespace,
    out: Path,
    script: str,
    extra: dict[str, Any] | None = None,
    also: tuple[Path, ...] = (),
) -> Path | None:
    """One file (``out`` + metadata), or this process's shard of the directory ``out`` will be
    merged from. A sharded run writes its metadata first (every shard the same, naming the
    request whose merged shards become ``out``); a sharded run with ``--overwrite`` removes the
    old ``out`` too, which the merge would replace."""
    shard, planned = shard_of(args), plan(loaded, request)
    claim(out, args, also + ((out,) if shard.count > 1 else ()))
    metadata = {
        "script": script,
        "argv": run_argv(),
        "args": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v)
                 for k, v in vars(args).items() if k not in ("shard_index", "num_shards")},
        "model": str(loaded.path),
        "model_sha256": loaded.file_hash,
        "request": request.record(),
        "output": str(out),
        "genes": len(loaded.config.genes),
        "num_cells": len(planned),
        **(extra or {}),
    }  # fmt: skip
    if shard.count > 1:
        metadata.update(status="sharded: merged by `sedd merge`", num_shards=shard.count)
        write_json_atomic(metadata_path(out), metadata)
        run_shard(
            planned, args.precision, out.parent, shard, settings=settings_from_args(args),
            progress=args.progress,
        )  # fmt: skip
        print(f"when every shard is done: sedd merge {out.parent} --out {out}")
        return None
    summary = write_one_file(
        planned, args.precision, out, settings=settings_from_args(args), progress=args.progress
    )
    metadata.update(num_cells=summary["cells"], summary=summary)
    write_json_atomic(metadata_path(out), metadata)
    return out
