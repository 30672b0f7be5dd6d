"""A sharded run whose manifest was edited or damaged is refused in one line naming the field and
its value, at once: a shard count of a billion, zero or -3, a cell count below zero, an entry
naming a file outside the run, and a FIFO or a device where a shard file should be (reading one
would block or never end). Merges and resumes read these files; each case here ran for minutes,
hung or ended in "list index out of range" before.

The runs are written by hand, as the shard jobs write theirs (``request_record``,
``shard_entry``), so no model is needed; one test resumes a real ``sedd generate`` shard."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anndata
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from checkpoint_files import ST3

from sedd.cli import main
from sedd.io.files import sha256_file
from sedd.io.hdf5_safety import ExternalDataError
from sedd.shards.manifest import (
    REQUEST_FILE,
    SHARD_DIR,
    ShardOutputError,
    ShardPaths,
    request_record,
    shard_entry,
)
from sedd.shards.merge import merge_shards
from sedd.shards.ranges import MAX_SHARDS, Shard, ShardError

GENES = ["G0", "G1", "G2"]
AFTERWARDS = "the file was edited or damaged: restore it, or rerun the shards into a new output"


def _soon(call: Callable[[], Any], seconds: float = 10) -> Any:
    """``call()``'s result, or the exception it raised, which must come within ``seconds``
    (they take milliseconds): a check that blocks on a FIFO fails here instead of hanging."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {time.monotonic() - start:.0f} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _run(root: Path, cells: int = 3, num_shards: int = 2) -> Path:
    """A finished run of ``cells`` cells in ``num_shards`` shards: the request record, and each
    shard's h5ad (every count 1) and entry."""
    out_dir = root / "run"
    (out_dir / SHARD_DIR).mkdir(parents=True)
    identity = {"request": {"seed": 0}, "cells": cells, "num_shards": num_shards}
    record = request_record(identity)
    (out_dir / REQUEST_FILE).write_text(json.dumps(record, indent=2))
    for k in range(num_shards):
        shard = Shard(k, num_shards)
        paths, cell_range = ShardPaths(out_dir, shard), shard.cell_range(cells)
        counts = sp.csr_matrix(np.ones((len(cell_range), len(GENES)), dtype=np.int32))
        obs = pd.DataFrame(index=[f"cell-{i}" for i in cell_range])
        anndata.AnnData(counts, obs=obs, var=pd.DataFrame(index=GENES)).write_h5ad(paths.h5ad)
        entry = shard_entry(
            shard=shard, cells=cell_range, identity_sha256=record["identity_sha256"], seed=0,
            h5ad=paths.h5ad, h5ad_sha256=sha256_file(paths.h5ad), stats={},
            precision_record={}, resumed_cells=0,
        )  # fmt: skip
        paths.entry.write_text(json.dumps(entry))
    return out_dir


def _edit_request(out_dir: Path, field: str, literal: str) -> Path:
    """Write ``literal`` (JSON text, e.g. ``1e9``) as ``identity.FIELD`` of the request file."""
    path = out_dir / REQUEST_FILE
    record = json.loads(path.read_text())
    record["identity"][field] = "@@"
    path.write_text(json.dumps(record).replace('"@@"', literal))
    return path


def _edit_entry(out_dir: Path, k: int, field: str, value: Any) -> Path:
    path = ShardPaths(out_dir, Shard(k, 2)).entry
    entry = json.loads(path.read_text())
    entry[field] = value
    path.write_text(json.dumps(entry))
    return path


def _merge_error(out_dir: Path, tmp_path: Path) -> str:
    with pytest.raises(ShardOutputError) as err:
        _soon(lambda: merge_shards(out_dir, tmp_path / "merged.h5ad"))
    message = str(err.value)
    assert "\n" not in message
    assert not (tmp_path / "merged.h5ad").exists()
    return message


def test_the_hand_written_run_merges_untampered(tmp_path: Path) -> None:
    """The runs below are sound but for what each test changes."""
    summary = _soon(lambda: merge_shards(_run(tmp_path), tmp_path / "merged.h5ad"))
    assert summary["cells"] == 3 and summary["shards"] == 2
    merged = anndata.read_h5ad(tmp_path / "merged.h5ad")
    assert list(merged.obs_names) == ["cell-0", "cell-1", "cell-2"]
    assert list(merged.var_names) == GENES


@pytest.mark.parametrize(
    ("literal", "shown"),
    [
        ("1e9", "1000000000.0"),  # JSON's 1e9 is a float
        ("1000000000", "1000000000"),
        (str(MAX_SHARDS + 1), str(MAX_SHARDS + 1)),
        ("0", "0"),
        ("-3", "-3"),
        ("2.5", "2.5"),
        ('"2"', "'2'"),
        ("true", "True"),
        ("null", "None"),
    ],
)
def test_a_tampered_shard_count_is_refused_naming_the_field_and_value(
    tmp_path: Path, literal: str, shown: str
) -> None:
    path = _edit_request(_run(tmp_path), "num_shards", literal)
    assert _merge_error(path.parent, tmp_path) == (
        f"request file {path}: identity.num_shards must be a whole number in 1..1,000,000, "
        f"got {shown}; {AFTERWARDS} directory."
    )


@pytest.mark.parametrize(("literal", "shown"), [("-1", "-1"), ("3.0", "3.0"), ('"3"', "'3'")])
def test_a_tampered_cell_count_is_refused_naming_the_field_and_value(
    tmp_path: Path, literal: str, shown: str
) -> None:
    path = _edit_request(_run(tmp_path), "cells", literal)
    assert _merge_error(path.parent, tmp_path) == (
        f"request file {path}: identity.cells must be a whole number >= 0, got {shown}; "
        f"{AFTERWARDS} directory."
    )


def test_a_run_of_a_million_shards_with_none_finished_is_listed_at_once(tmp_path: Path) -> None:
    """The most shards a request may have: merge lists what is missing from one look at the
    directory, not a million look-ups."""
    out_dir = _run(tmp_path)
    _edit_request(out_dir, "num_shards", str(MAX_SHARDS))
    start = time.monotonic()
    message = _merge_error(out_dir, tmp_path)
    assert time.monotonic() - start < 5  # about 8 s when each shard's files were looked up
    assert message.startswith(
        f"1000000 of 1000000 shards are not finished in {out_dir / SHARD_DIR}: shard(s) 0, 1, 2,"
    )
    assert "and 999980 more" in message


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("/dev/zero", "a path outside {out_dir}"),
        ("../../outside.h5ad", "a path outside {out_dir}"),
        ("shard-00001-of-00002.h5ad", "not this shard's file"),
        (None, "not this shard's file"),
    ],
)
def test_an_entry_naming_another_file_is_refused(
    tmp_path: Path, name: str | None, problem: str
) -> None:
    out_dir = _run(tmp_path)
    entry = _edit_entry(out_dir, 0, "h5ad", name)
    assert _merge_error(out_dir, tmp_path) == (
        f"shard entry {entry}: h5ad is {name!r} ({problem.format(out_dir=out_dir)}), expected "
        f"'shard-00000-of-00002.h5ad'; delete {entry} and rerun shard 0."
    )


def test_a_shard_file_linked_to_dev_zero_is_refused_unread(tmp_path: Path) -> None:
    out_dir = _run(tmp_path)
    h5ad = ShardPaths(out_dir, Shard(1, 2)).h5ad
    h5ad.unlink()
    h5ad.symlink_to("/dev/zero")
    assert _merge_error(out_dir, tmp_path) == (
        f"shard h5ad {h5ad} is a character device (a link to /dev/zero), not a regular file, so "
        "it is not read; delete it and rerun the shard(s) that write it."
    )


@pytest.mark.parametrize("which", ["h5ad", "entry", "request"])
def test_a_fifo_in_place_of_a_run_file_is_refused_unopened(tmp_path: Path, which: str) -> None:
    out_dir = _run(tmp_path)
    paths = ShardPaths(out_dir, Shard(1, 2))
    path, what = {
        "h5ad": (paths.h5ad, "shard h5ad"),
        "entry": (paths.entry, "shard entry"),
        "request": (out_dir / REQUEST_FILE, "request file"),
    }[which]
    path.unlink()
    os.mkfifo(path)
    assert _merge_error(out_dir, tmp_path) == (
        f"{what} {path} is a FIFO, not a regular file, so it is not read; delete it and rerun "
        "the shard(s) that write it."
    )


def test_sedd_merge_reports_a_tampered_manifest_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = _run(tmp_path)
    request = _edit_request(out_dir, "num_shards", "1e9")
    out = tmp_path / "merged.h5ad"
    assert _soon(lambda: main(["merge", str(out_dir), "--out", str(out)])) == 2
    err = capsys.readouterr().err
    assert err == (
        f"sedd merge: error: request file {request}: identity.num_shards must be a whole number "
        f"in 1..1,000,000, got 1000000000.0; {AFTERWARDS} directory.\n"
    )
    _edit_request(out_dir, "num_shards", "2")
    fifo = ShardPaths(out_dir, Shard(0, 2)).h5ad
    fifo.unlink()
    os.mkfifo(fifo)
    assert _soon(lambda: main(["merge", str(out_dir), "--out", str(out)])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sedd merge: error: shard h5ad {fifo} is a FIFO, not a regular file")
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


def test_a_shard_count_past_the_limit_is_refused_before_a_run_starts() -> None:
    with pytest.raises(ShardError, match=r"at most 1,000,000, got 1000001; run fewer, larger"):
        Shard(0, MAX_SHARDS + 1)


@pytest.mark.filterwarnings("ignore:GENES ARE POSITIONAL")
def test_resuming_a_shard_whose_h5ad_is_a_fifo_is_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume reads the finished shard's h5ad to check its hash: a FIFO there is refused."""
    out_dir = tmp_path / "run"
    argv = ["generate", "--model", str(ST3 / "tiny_mlm"), "--num-cells", "2", "--steps", "1",
            "--device", "cpu", "--precision", "fp32", "--out-dir", str(out_dir)]  # fmt: skip
    assert main(argv) == 0
    h5ad = ShardPaths(out_dir, Shard(0, 1)).h5ad
    h5ad.unlink()
    os.mkfifo(h5ad)
    capsys.readouterr()
    assert _soon(lambda: main(argv)) == 2
    err = capsys.readouterr().err  # after the tiny model's warning that its genes are numbers
    assert [line for line in err.splitlines() if not line.startswith("warning: ")] == [
        f"sedd generate: error: shard h5ad {h5ad} is a FIFO, not a regular file, so it is not "
        "read; delete it and rerun the shard(s) that write it."
    ]
    assert "Traceback" not in err


def test_a_shard_whose_counts_live_in_another_file_is_refused_unread(tmp_path: Path) -> None:
    """A shard h5ad rewritten so that ``X`` is an HDF5 external link (its hash updated in the
    entry, as a tamperer would) is refused before merge reads it (sedd.io.hdf5_safety)."""
    out_dir = _run(tmp_path)
    other = tmp_path / "secret.h5"
    with h5py.File(other, "w") as f:
        f["counts"] = np.full((2, len(GENES)), 7, dtype=np.int32)
    shard = ShardPaths(out_dir, Shard(1, 2)).h5ad
    with h5py.File(shard, "r+") as f:
        del f["X"]
        f["X"] = h5py.ExternalLink(str(other), "/counts")
    _edit_entry(out_dir, 1, "h5ad_sha256", sha256_file(shard))
    with pytest.raises(ExternalDataError) as err:
        _soon(lambda: merge_shards(out_dir, tmp_path / "merged.h5ad"))
    message = str(err.value)
    assert message.startswith(f"shard 1 {shard}: /X is an HDF5 external link to /counts in ")
    assert "\n" not in message and not (tmp_path / "merged.h5ad").exists()
