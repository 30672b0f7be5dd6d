"""The one CLI route of ``sedd generate``, ``sedd predict``, ``sedd impute`` and the st3 scripts:
each builds a request (``request_from_args``), and ``run_request`` plans it once and runs it
into one file or one shard of an output directory, with a progress bar, the summary line and
the JSON metrics file.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from sedd.checkpoints import LoadedModel
from sedd.commands.args import show_progress
from sedd.defaults import LIBRARY_SCHEDULE, OPTION_NAMES, SamplingOptions, Schedule
from sedd.engine import EngineSettings
from sedd.engine.offline import ProgressHook
from sedd.io.cell_writer import CellWriter
from sedd.io.files import check_writable, refuse_existing, stale_records, write_json_atomic
from sedd.io.write import COUNT_SCALE
from sedd.precision import PrecisionPolicy, resolve_precision
from sedd.request.draws import EXPECTED_LAYER, MEAN_LAYER
from sedd.request.imputation import Imputation
from sedd.request.plan import GenerationRequest, Plan, plan
from sedd.request.provenance import run_provenance
from sedd.run import progress_bar, run_plan
from sedd.shards.job import prepare_shard
from sedd.shards.ranges import Shard, ShardError, resolve_shard

CountsDtype = Literal["int", "float32"]


def run_request(
    loaded: LoadedModel, request: GenerationRequest, args: argparse.Namespace
) -> dict[str, Any]:
    """Plan ``request`` once and run it as the output options in ``args`` say (``--out``, or
    ``--out-dir`` and a shard); returns the summary."""
    planned = plan(loaded, request)
    shard = resolve_shard(args.num_shards, args.shard_index)
    progress = getattr(args, "progress", None)  # add_progress_argument's
    settings = settings_from_args(args)
    if args.out_dir is None:
        if shard.count > 1:
            raise ShardError(
                f"{shard.count} shards (--num-shards or $SLURM_ARRAY_TASK_COUNT) need --out-dir "
                "DIR: each shard writes DIR/shards/..., and `sedd merge DIR` joins them."
            )
        out = claim_output(args.out or args.default_out, args.overwrite)
        return write_one_file(
            planned, args.precision, out, args.counts_dtype, settings=settings, progress=progress
        )
    if args.counts_dtype != "int":
        raise ValueError("--counts-dtype float32 applies to `sedd merge` in --out-dir mode.")
    return run_shard(
        planned, args.precision, args.out_dir, shard, settings=settings, progress=progress
    )


def check_h5ad_name(out: Path | None, flag: str = "--out") -> None:
    """Refuse an output name that does not end in ``.h5ad``: what is written is AnnData's HDF5
    whatever the name says, so ``cells.csv`` would be an HDF5 file that no CSV reader opens.
    Commands call this before the model loads. A directory is left to ``check_writable``,
    which says to name a file in it."""
    if out is None or out.suffix.lower() == ".h5ad" or out.is_dir():
        return
    raise ValueError(
        f"{flag} {out}: sedd writes AnnData .h5ad files only, so the name must end in .h5ad "
        f"(not {out.suffix or 'no suffix'!r}); pass e.g. {flag} {out.with_suffix('.h5ad')}."
    )


def claim_output(
    out: Path,
    overwrite: bool,
    *,
    flag: str = "--out",
    overwrite_flag: str = "--overwrite",
    also: tuple[Path, ...] = (),
) -> Path:
    """``out``, once it may be written: refused when it is not an ``.h5ad`` name, or holds an
    earlier result (unless ``overwrite``); with ``overwrite``, the records describing the old
    cells (``sedd.io.files.stale_records``, and ``also``) are removed first, so none outlives
    them. ``flag`` and ``overwrite_flag`` are the options the errors name."""
    check_h5ad_name(out, flag)
    refuse_existing(out, overwrite=overwrite, flag=overwrite_flag)
    if out.exists():  # records of a file not yet written describe the run now writing it
        for record in [*stale_records(out), *also]:
            record.unlink(missing_ok=True)
    return out


def request_from_args(
    args: argparse.Namespace,
    *,
    cells_per_condition: int,
    conditions: list[str] | tuple[str, ...] | None,
    imputation: Imputation | None = None,
    condition_counts: tuple[int, ...] | None = None,
    n_samples: int = 1,
    expected: bool = False,
    schedule: Schedule = LIBRARY_SCHEDULE,
) -> GenerationRequest:
    """The request that ``add_sampling_arguments`` options describe (``n_samples``: draws of
    each imputed cell, ``sedd impute --n-samples``; ``expected``: ``sedd impute --expected``):
    its sampling options are the flags named
    for ``SamplingOptions``' fields, all of them, by name; the schedule left out is the
    model's (``schedule``: ``LoadedModel.schedule``)."""
    given = {name: getattr(args, name) for name in OPTION_NAMES if hasattr(args, name)}
    sampling = SamplingOptions.resolve(**given, default=schedule)
    return GenerationRequest(
        cells_per_condition, conditions, args.cell_type, sampling,  # type: ignore[arg-type]
        imputation=imputation, condition_counts=condition_counts, n_samples=n_samples,
        expected=expected,
    )  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> EngineSettings:
    """How the run's engine is set up: ``--batch-size``, ``--tokens-per-forward``,
    ``--cuda-graphs``, ``--threads`` (not part of the request)."""
    return EngineSettings(
        args.batch_size, getattr(args, "tokens_per_forward", None),
        getattr(args, "cuda_graphs", None), getattr(args, "threads", None),
    )  # fmt: skip


def write_one_file(
    planned: Plan,
    precision_name: str,
    out: Path,
    counts_dtype: CountsDtype = "int",
    *,
    settings: EngineSettings,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Generate (with a progress bar as ``show_progress(progress)`` says), write the h5ad and
    ``<out>.metrics.json``, print a summary. Several draws a cell (``n_samples``) stream their
    mean into ``layers["mean_of_draws"]`` batch by batch, beside the first draw's counts, and
    ``expected`` the expected counts into ``layers["expected_counts"]``."""
    loaded, request = planned.loaded, planned.request
    precision = resolve_precision(precision_name, loaded.device)
    layers = ((MEAN_LAYER,) if request.n_samples > 1 else ()) + (
        (EXPECTED_LAYER,) if request.expected else ()
    )
    writer = CellWriter(
        check_writable(out), loaded.config.genes, count_dtype=counts_dtype, var=planned.var(),
        layers=layers,
    )  # fmt: skip
    draws = len(planned) * request.n_samples  # the bar counts every draw of a cell

    def add_layers(_: range, made: Mapping[str, Any]) -> None:  # a batch's (B, G) float32 each
        for name, values in made.items():
            writer.add_layer(name, values)

    with writer, _bar(draws, "sampling", progress) as on_progress:
        result = run_plan(
            planned, precision, on_progress=on_progress,
            on_batch=lambda _, counts: writer.add(counts), on_layers=add_layers,
            keep_counts=False, settings=settings,
        )  # fmt: skip
        uns = run_provenance(loaded, request, precision, result.stats, engine=result.engine)
        writer.finish(result.obs, uns)
    return finish(out, result.stats, precision, num_genes=len(result.genes))


def run_shard(
    planned: Plan,
    precision_name: str,
    out_dir: Path,
    shard: Shard,
    *,
    settings: EngineSettings,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run (or resume, or skip) one shard into ``out_dir``; print its summary. A progress bar
    as ``show_progress(progress)`` says."""
    precision = resolve_precision(precision_name, planned.loaded.device)
    job = prepare_shard(planned, precision, out_dir, shard, settings)
    label = f"shard {shard.index}/{shard.count}"
    if job.done_entry is not None:
        print(f"{label}: already complete ({job.paths.h5ad}, sha256 ok); nothing to do")
        return job.done_entry
    if job.resumed_cells:
        print(f"{label}: resuming, {job.resumed_cells} of {len(job.cells)} cells already done")
    with _bar(job.cells_to_generate, label, progress) as on_progress:
        entry = job.run(on_progress=on_progress)
    finish(
        job.paths.h5ad,
        entry["timings"],
        precision,
        num_genes=planned.loaded.config.num_genes,
        metrics_path=job.paths.entry,
    )
    return entry


@contextlib.contextmanager
def _bar(cells: int, desc: str, progress: bool | None) -> Iterator[ProgressHook | None]:
    """``sedd.run.progress_bar``'s hook where a bar is wanted, else no hook."""
    if not show_progress(progress):
        yield None
        return
    with progress_bar(cells, desc) as hook:
        yield hook


def finish(
    out: Path,
    stats: Mapping[str, Any],
    precision: PrecisionPolicy,
    *,
    num_genes: int,
    metrics_path: Path | None = None,
) -> dict[str, Any]:
    """Write the metrics JSON (unless ``metrics_path`` is already written) and print the summary.

    ``<out>.metrics.json`` is the default place; a shard's entry file doubles as its metrics.
    """
    summary = {
        "output": str(out),
        "scale": COUNT_SCALE,  # what the output file's .X holds
        **stats,
        "precision": precision.record(int(stats.get("fp32_fallbacks") or 0)),
    }
    if metrics_path is None:
        metrics_path = out.with_suffix(".metrics.json")
        write_json_atomic(metrics_path, summary)
    print(summary_line(out, stats, precision, num_genes) + f"; metrics: {metrics_path}")
    return summary


def summary_line(
    out: Path, stats: Mapping[str, Any], precision: PrecisionPolicy, num_genes: int
) -> str:
    """One line from ``sedd.run.run_stats`` (or a shard's sum of them)."""
    gpu = stats.get("gpu_utilization_pct")  # only where NVML reads the GPU
    busy = f", GPU {gpu:.0f}% busy at the end" if gpu is not None else ""
    draws = int(stats.get("n_samples") or 1)  # stats count every draw; the file one a cell
    each = f" (and the mean of {draws} draws each)" if draws > 1 else ""
    # a shard sum's stats may predate these figures: 0 then
    forwards_per_cell = float(stats.get("forwards_per_cell") or 0.0)
    genes_per_forward = float(stats.get("genes_per_forward") or 0.0)
    return (
        f"wrote {out}: {int(stats['cells']) // draws} cells x {num_genes} genes{each} in "
        f"{stats['seconds']:.1f} s ({stats['cells_per_s']:.2f} cells/s, "
        f"{stats['tokens_per_s']:.0f} tokens/s, {stats['forwards']} forwards = "
        f"{stats['forwards_per_s']:.1f} forwards/s, {forwards_per_cell:.2f} forwards a cell "
        f"committing {genes_per_forward:.1f} genes each, peak memory "
        f"{stats['peak_memory_mib']:.0f} MiB [{stats['peak_memory_kind']}], "
        f"{stats['current_memory_mib']:.0f} MiB at the end{busy}, precision {precision.name} on "
        f"{precision.device}, TF32 {'on' if precision.tf32 else 'off'}, "
        f"fp32 fallbacks {stats['fp32_fallbacks']})"
    )
