"""``sedd predict`` / ``generate --out-dir`` shards, resume after a kill, and ``sedd merge``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from engine_models import request_of

from sedd.checkpoints import load_checkpoint, save_native
from sedd.cli import main
from sedd.engine import EngineSettings
from sedd.io.files import sha256_file
from sedd.precision import resolve_precision
from sedd.request.plan import plan
from sedd.shards.job import prepare_shard
from sedd.shards.manifest import ShardOutputError
from sedd.shards.merge import MergeError, merge_shards
from sedd.shards.ranges import Shard

ST3 = Path(__file__).resolve().parents[1] / "data" / "st3" / "experiments"
GENES = [f"GENE{i}" for i in range(64)]
PERTURBATIONS = ["GENE_A", "GENE_B"]


@pytest.fixture(scope="module", autouse=True)
def default_device_is_a_gpu() -> Iterator[None]:
    """On a GPU machine the CLI's default device is CUDA, and these tests assert what a CPU run
    reports (process RSS, "on cpu", no GPU fields): every command here names ``--device cpu``.
    The default is CUDA here too, so a command that leaves it out fails on every machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sedd.commands.loading.default_device", lambda: "cuda")
        yield


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny st3 perturbation model (64 genes, labels non-targeting + GENE_A..D), native."""
    root = tmp_path_factory.mktemp("model")
    (root / "genes.txt").write_text("\n".join(GENES) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_checkpoint(ST3 / "tiny_pert", genes=root / "genes.txt")
    return save_native(loaded, root / "native")


def _predict(model: Path, *args: str, cells: int = 3, batch: int = 4) -> int:
    return main(
        [
            "predict",
            "--model",
            str(model),
            "--cells-per-perturbation",
            str(cells),
            "--steps",
            "3",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--seed",
            "7",
            "--batch-size",
            str(batch),
            *args,
        ]
    )


def _dense(adata: anndata.AnnData) -> np.ndarray:
    return adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)


def _assert_same_cells(a: Path, b: Path) -> None:
    one, two = anndata.read_h5ad(a), anndata.read_h5ad(b)
    assert list(one.var_names) == list(two.var_names) == GENES
    assert np.array_equal(_dense(one), _dense(two))
    assert one.obs.astype(str).equals(two.obs.astype(str))


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted one-file run: 9 cells (control + 2 perturbations x 3), batch size 7."""
    out = tmp_path_factory.mktemp("ref") / "one.h5ad"
    assert _predict(model, "--perturbations", *PERTURBATIONS, "--out", str(out), batch=7) == 0
    return out


def _predict_into(model: Path, out_dir: Path, *args: str, batch: int) -> None:
    """The reference request (control + PERTURBATIONS x 3 cells), into ``out_dir``'s shards."""
    argv = ("--perturbations", *PERTURBATIONS, "--out-dir", str(out_dir), *args)
    assert _predict(model, *argv, batch=batch) == 0


def _sharded(model: Path, out_dir: Path, shards: int = 4, batch: int = 2) -> None:
    for k in range(shards):
        _predict_into(
            model, out_dir, "--num-shards", str(shards), "--shard-index", str(k), batch=batch
        )


def test_predict_writes_gene_named_cells_control_first_with_summary_and_metrics(
    reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adata = anndata.read_h5ad(reference)
    assert adata.shape == (9, 64) and list(adata.var_names) == GENES
    assert (
        list(adata.obs["perturbation"]) == ["non-targeting"] * 3 + ["GENE_A"] * 3 + ["GENE_B"] * 3
    )
    # a perturbation model: the label as `perturbation`, `condition` and st3's --gene column
    assert list(adata.obs["condition"]) == list(adata.obs["perturbation"])
    assert list(adata.obs["gene"]) == list(adata.obs["perturbation"])
    assert list(adata.obs["condition_idx"]) == [0] * 3 + [1] * 3 + [2] * 3
    assert list(adata.obs["sample_idx"]) == [0, 1, 2] * 3
    assert list(adata.obs["cell_index"]) == list(range(9)) and set(adata.obs["seed"]) == {7}
    assert adata.uns["sedd"]["precision"]["amp_dtype"] == "fp32"
    metrics = json.loads(reference.with_suffix(".metrics.json").read_text())
    # 2 batches (5 + 4 cells) fit one 128-row forward block: they run in lockstep, so 3 steps
    # are 3 model calls; the denoise found no mask left and ran none
    assert metrics["cells"] == 9 and metrics["forwards"] == 3
    assert metrics["tokens_per_s"] == pytest.approx(metrics["cells_per_s"] * 64)
    assert metrics["cells_per_s"] == pytest.approx(9 / metrics["seconds"])
    assert metrics["forwards_per_s"] == pytest.approx(3 / metrics["seconds"])
    assert metrics["forwards_per_s"] > 0 and metrics["fp32_fallbacks"] == 0
    # on CPU: the process's peak RSS (torch alone is > 50 MiB) and the RSS at the end, at most
    # the peak (give or take the pages the kernel's per-thread RSS counters have not synced)
    assert metrics["peak_memory_kind"] == "process_rss"
    assert 50 < metrics["current_memory_mib"] <= metrics["peak_memory_mib"] + 16
    assert "gpu_utilization_pct" not in metrics  # no NVML GPU here
    assert {"precision", "output"} <= set(metrics)


def test_summary_line_shows_rates_memory_and_precision(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "two.h5ad"
    argv = ("--perturbations", "GENE_A", "--no-control", "--out", str(out))
    assert _predict(model, *argv, cells=2) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert line.startswith(f"wrote {out}: 2 cells x 64 genes in ")
    assert f"{metrics['cells_per_s']:.2f} cells/s, " in line
    assert f"{metrics['tokens_per_s']:.0f} tokens/s, " in line
    assert f"{metrics['forwards']} forwards = {metrics['forwards_per_s']:.1f} forwards/s, " in line
    assert metrics["forwards"] in (3, 4)  # 3 steps, and the denoise only if a mask was left
    assert f"peak memory {metrics['peak_memory_mib']:.0f} MiB [process_rss], " in line
    assert f"{metrics['current_memory_mib']:.0f} MiB at the end, precision fp32 on cpu" in line
    assert "GPU" not in line and line.endswith(f"metrics: {out.with_suffix('.metrics.json')}")


def test_predict_file_no_control_and_default_all_labels(model: Path, tmp_path: Path) -> None:
    names = tmp_path / "perts.txt"
    names.write_text("GENE_D\n# a comment\n\nGENE_C\n")
    out = tmp_path / "file.h5ad"
    assert (
        _predict(
            model, "--perturbations-file", str(names), "--no-control", "--out", str(out), cells=1
        )
        == 0
    )
    assert list(anndata.read_h5ad(out).obs["perturbation"]) == ["GENE_D", "GENE_C"]
    out = tmp_path / "all.h5ad"
    assert _predict(model, "--out", str(out), cells=1) == 0
    assert list(anndata.read_h5ad(out).obs["perturbation"]) == [
        "non-targeting",
        "GENE_A",
        "GENE_B",
        "GENE_C",
        "GENE_D",
    ]


def test_predict_unknown_perturbation_is_a_clear_error(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _predict(model, "--perturbations", "gene_a", "--out", str(tmp_path / "x.h5ad")) == 2
    assert "did you mean 'GENE_A'" in capsys.readouterr().err


def test_four_shards_merged_equal_one_shard_run_cell_for_cell(
    model: Path, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "run"
    _sharded(model, out_dir)
    names = sorted(p.name for p in (out_dir / "shards").iterdir())
    assert names == [f"shard-0000{k}-of-00004.{ext}" for k in range(4) for ext in ("h5ad", "json")]
    entry = json.loads((out_dir / "shards" / "shard-00001-of-00004.json").read_text())
    assert entry["cell_range"] == [3, 5] and entry["cells"] == 2 and entry["seed"] == 7
    assert main(["merge", str(out_dir), "--out", str(tmp_path / "merged.h5ad")]) == 0
    _assert_same_cells(reference, tmp_path / "merged.h5ad")
    summary = json.loads((tmp_path / "merged.metrics.json").read_text())
    assert summary["scale"] == "counts" and summary["cells"] == 9  # says what .X holds
    # merging again is refused (the merged file is a result), and with --overwrite gives the same
    merged = tmp_path / "merged.h5ad"
    first = merged.stat().st_mtime_ns
    assert main(["merge", str(out_dir), "--out", str(merged)]) == 2
    assert merged.stat().st_mtime_ns == first
    assert main(["merge", str(out_dir), "--out", str(merged), "--overwrite"]) == 0
    _assert_same_cells(reference, merged)
    # a rerun skips complete shards
    before = (out_dir / "shards" / "shard-00002-of-00004.h5ad").stat().st_mtime_ns
    capsys.readouterr()
    _sharded(model, out_dir, batch=3)  # another batch size does not change the request
    assert capsys.readouterr().out.count("already complete") == 4
    assert (out_dir / "shards" / "shard-00002-of-00004.h5ad").stat().st_mtime_ns == before


def test_adaptive_cells_sharded_and_merged_equal_a_one_file_run(model: Path, tmp_path: Path):
    """The entropy-bounded sampler's cells finish at different forwards; sharded, each in
    other batches, they are still the one-file run's, and each shard reports their cost."""
    adaptive = ("--perturbations", *PERTURBATIONS, "--sampler", "entropy", "--entropy-bound", "20")
    one = tmp_path / "one.h5ad"
    assert _predict(model, *adaptive, "--out", str(one), batch=7) == 0
    out_dir = tmp_path / "run"
    for k in range(3):
        shard = ("--num-shards", "3", "--shard-index", str(k), "--out-dir", str(out_dir))
        assert _predict(model, *adaptive, *shard, batch=2) == 0
    assert main(["merge", str(out_dir), "--out", str(tmp_path / "merged.h5ad")]) == 0
    _assert_same_cells(one, tmp_path / "merged.h5ad")
    assert anndata.read_h5ad(one).uns["sedd"]["entropy_bound"] == 20.0
    entry = json.loads((out_dir / "shards" / "shard-00000-of-00003.json").read_text())
    assert 1 <= entry["timings"]["forwards_per_cell"] <= 3  # --steps 3 is the cap


class _Killed(BaseException):
    """Stands in for a kill (SIGINT/SIGTERM reach Python as BaseExceptions): the engine lets
    it through, as it would KeyboardInterrupt."""


def test_killed_shard_resumes_from_finished_batches_to_identical_result(
    model: Path, reference: Path, tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_checkpoint(model)
    request = request_of(
        cells_per_condition=3,
        conditions=("non-targeting", *PERTURBATIONS),
        steps=3,
        seed=7,
    )
    out_dir = tmp_path / "run"
    job = prepare_shard(
        plan(loaded, request), resolve_precision("fp32", "cpu"), out_dir, Shard(0, 1),
        EngineSettings(batch_size=2),
    )  # fmt: skip
    save = job._save_part

    def save_then_kill(cells: range, counts: np.ndarray) -> None:
        save(cells, counts)
        if len(job.parts) == 2:  # two batches saved, the others in flight
            raise _Killed

    job._save_part = save_then_kill  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        job.run()
    parts = sorted(job.parts_dir.glob("cells-*.npz"))
    assert [p.name for p in parts] == [
        "cells-000000000000-000000000002.npz",
        "cells-000000000002-000000000004.npz",
    ]
    assert not (out_dir / "shards" / "shard-00000-of-00001.json").exists()
    parts[1].unlink()  # lose a finished batch too
    (job.parts_dir / ".cells-000000000004-000000000006.npz.999.tmp").write_bytes(b"half")
    _predict_into(model, out_dir, "--num-shards", "1", batch=5)
    entry = json.loads((out_dir / "shards" / "shard-00000-of-00001.json").read_text())
    assert entry["resumed_cells"] == 2 and entry["timings"]["cells_generated"] == 7
    timings = entry["timings"]  # 7 new cells at batch size 5: 2 batches in lockstep
    assert timings["forwards"] == 3  # 3 steps; no mask was left for the denoise
    assert timings["forwards_per_s"] == pytest.approx(3 / timings["seconds"])
    assert timings["cells_per_s"] == pytest.approx(7 / timings["seconds"])
    assert timings["peak_memory_kind"] == "process_rss"
    assert 0 < timings["current_memory_mib"] <= timings["peak_memory_mib"] + 16
    assert not job.parts_dir.exists()
    merge_shards(out_dir, tmp_path / "merged.h5ad")
    _assert_same_cells(reference, tmp_path / "merged.h5ad")


@pytest.fixture
def complete_run(model: Path, tmp_path: Path) -> Path:
    out_dir = tmp_path / "run"
    _sharded(model, out_dir, batch=4)
    return out_dir


def _shard_file(out_dir: Path, k: int, ext: str) -> Path:
    return out_dir / "shards" / f"shard-{k:05d}-of-00004.{ext}"


def test_merge_names_missing_shards(complete_run: Path, tmp_path: Path) -> None:
    _shard_file(complete_run, 1, "json").unlink()
    _shard_file(complete_run, 3, "h5ad").unlink()
    with pytest.raises(MergeError, match=r"2 of 4 shards .* shard\(s\) 1, 3"):
        merge_shards(complete_run, tmp_path / "m.h5ad")
    assert not (tmp_path / "m.h5ad").exists()


def test_merge_refuses_hash_mismatch(complete_run: Path, tmp_path: Path) -> None:
    with _shard_file(complete_run, 2, "h5ad").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(MergeError, match=r"shard\(s\) 2: the h5ad does not match the sha256"):
        merge_shards(complete_run, tmp_path / "m.h5ad")


def _replace_shard(out_dir: Path, k: int, adata: anndata.AnnData) -> None:
    h5ad = _shard_file(out_dir, k, "h5ad")
    adata.write_h5ad(h5ad)
    entry_path = _shard_file(out_dir, k, "json")
    entry = json.loads(entry_path.read_text())
    entry["h5ad_sha256"] = sha256_file(h5ad)
    entry_path.write_text(json.dumps(entry))


def test_merge_refuses_duplicate_cells_and_wrong_counts(complete_run: Path, tmp_path: Path) -> None:
    first = anndata.read_h5ad(_shard_file(complete_run, 0, "h5ad"))  # cells 0..2
    second = anndata.read_h5ad(_shard_file(complete_run, 1, "h5ad"))  # cells 3..4
    _replace_shard(complete_run, 1, first[:2].copy())
    with pytest.raises(MergeError, match="more than one shard"):
        merge_shards(complete_run, tmp_path / "m.h5ad")
    _replace_shard(complete_run, 1, second[:1].copy())
    with pytest.raises(MergeError, match="holds 1 cells, its entry says 2"):
        merge_shards(complete_run, tmp_path / "m.h5ad")
    entry_path = _shard_file(complete_run, 1, "json")
    entry = json.loads(entry_path.read_text())
    entry["cell_range"] = [2, 5]
    entry_path.write_text(json.dumps(entry))
    with pytest.raises(MergeError, match=r"covers cells \[2, 5\].*expected \[3, 5\]"):
        merge_shards(complete_run, tmp_path / "m.h5ad")


def test_other_request_into_same_dir_fails_clearly(
    model: Path, complete_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = _predict(
        model,
        "--perturbations",
        *PERTURBATIONS,
        "--out-dir",
        str(complete_run),
        "--num-shards",
        "4",
        "--shard-index",
        "0",
        "--seed",
        "8",
    )
    assert code == 2
    assert "different request (seed: 7 -> 8)" in capsys.readouterr().err
    entry_path = _shard_file(complete_run, 3, "json")
    entry = json.loads(entry_path.read_text())
    entry["identity_sha256"] = "0" * 64
    entry_path.write_text(json.dumps(entry))
    with pytest.raises(MergeError, match=r"shard\(s\) 3 .* different request"):
        merge_shards(complete_run, tmp_path / "m.h5ad")
    with pytest.raises(ShardOutputError, match="belongs to another request"):
        _run_shard_directly(model, complete_run, Shard(3, 4))
    assert main(["merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m.h5ad")]) == 2


def _run_shard_directly(model: Path, out_dir: Path, shard: Shard) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_checkpoint(model)
    request = request_of(3, ("non-targeting", *PERTURBATIONS), steps=3, seed=7)
    prepare_shard(
        plan(loaded, request), resolve_precision("fp32", "cpu"), out_dir, shard, EngineSettings()
    )


def test_shard_defaults_from_slurm_array_env(
    model: Path,
    reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out_dir = tmp_path / "run"
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    for task_id in ("1", "2"):  # --array=1-2
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task_id)
        assert _predict(model, "--perturbations", *PERTURBATIONS, "--out-dir", str(out_dir)) == 0
    assert {p.name for p in (out_dir / "shards").glob("*.json")} == {
        "shard-00000-of-00002.json",
        "shard-00001-of-00002.json",
    }
    merge_shards(out_dir, tmp_path / "merged.h5ad")
    _assert_same_cells(reference, tmp_path / "merged.h5ad")
    capsys.readouterr()
    assert _predict(model, "--out", str(tmp_path / "x.h5ad")) == 2  # 2 shards need --out-dir
    assert "need --out-dir" in capsys.readouterr().err


def test_generate_shards_too_even_more_shards_than_cells(model: Path, tmp_path: Path) -> None:
    base = ["generate", "--model", str(model), "--cells", "2", "--conditions", "GENE_C",
            "--steps", "2", "--device", "cpu", "--precision", "fp32"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "one.h5ad")]) == 0
    out_dir = str(tmp_path / "d")
    for k in range(3):  # shard 2 is empty
        assert (
            main([*base, "--out-dir", out_dir, "--num-shards", "3", "--shard-index", str(k)]) == 0
        )
    empty = json.loads((tmp_path / "d" / "shards" / "shard-00002-of-00003.json").read_text())
    assert empty["cells"] == 0 and empty["timings"]["cells_per_s"] == 0.0
    assert empty["timings"]["forwards"] == 0 and empty["timings"]["forwards_per_s"] == 0.0
    assert main(["merge", out_dir, "--out", str(tmp_path / "m.h5ad")]) == 0
    one, merged = anndata.read_h5ad(tmp_path / "one.h5ad"), anndata.read_h5ad(tmp_path / "m.h5ad")
    assert np.array_equal(_dense(one), _dense(merged))
    assert list(merged.obs_names) == list(one.obs_names)  # named by request, not by shard
    assert [name.split("-")[1] for name in merged.obs_names] == ["0", "1"]
    pd.testing.assert_frame_equal(merged.obs, one.obs)


def test_predict_cell_type_on_a_vector_conditioned_model(tmp_path: Path) -> None:
    out = tmp_path / "ct.h5ad"
    argv = ["predict", "--model", str(ST3 / "tiny_pert_ct_esm"), "--perturbations", "GENE_B",
            "--cell-type", "rpe1", "--cells-per-perturbation", "1", "--steps", "2",
            "--device", "cpu", "--precision", "fp32", "--out", str(out)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    obs = anndata.read_h5ad(out).obs
    assert list(obs["perturbation"]) == ["non-targeting", "GENE_B"]
    assert list(obs["cell_type"]) == ["rpe1", "rpe1"] and list(obs["condition_idx"]) == [0, 2]
