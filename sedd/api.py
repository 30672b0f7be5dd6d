"""The Python front door: ``sedd.load(path) -> Model``; its methods return AnnData.

    import sedd

    model = sedd.load()  # the bundled PBMC model; or any path `sedd generate --model` takes
    cells = model.generate(100, condition="CD14+ Monocyte", seed=0)  # the default schedule
    cells.obs["bulk_labels"].value_counts()

Each call builds the library's one request type and runs it on the batching engine in this
thread (the server runs the same engine on a thread of its own), so the same request gives the
same cells here, from ``sedd generate`` and from the server: cell i of a request draws from
random stream (seed, i).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import anndata
import torch

from sedd.checkpoints import DEFAULT_MODEL, LoadedModel, load_checkpoint, model_card_dict
from sedd.defaults import (
    CELLS_PER_PERTURBATION,
    DEFAULT_BATCH_SIZE,
    SamplingOptions,
    default_device,
    resolve_threads,
)
from sedd.diffusion.cuda_graphs import cuda_graphs_from_env
from sedd.diffusion.sampling import Sampler
from sedd.engine import EngineSettings, forward_rows, model_sampler
from sedd.io.write import cells_anndata
from sedd.precision import AmpName, PrecisionPolicy, resolve_precision
from sedd.request.conditions import label_mix, perturbation_conditions
from sedd.request.draws import check_n_samples
from sedd.request.imputation import (
    Imputation,
    dropped_genes_warning,
    imputation_conditions,
    imputation_from_anndata,
    with_cell_types,
)
from sedd.request.plan import GenerationRequest, plan
from sedd.request.provenance import run_provenance
from sedd.run import interactive, progress_bar, run_plan

__all__ = ["Model", "load"]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _warns_at_caller(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """The library's warnings during ``method`` point at the user's line, not at ours, each
    distinct one once per call; the user's warning filters still decide what shows."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        caught: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as caught:  # type: ignore[assignment]
                warnings.simplefilter("always")
                return method(*args, **kwargs)
        finally:
            _warn_again(caught)

    return wrapper


def _warn_again(caught: list[warnings.WarningMessage]) -> None:
    seen: set[tuple[type[Warning], str]] = set()
    for item in caught:
        key = (item.category, str(item.message))
        if key not in seen:
            seen.add(key)
            # stack: _warn_again, the wrapper, the user's call
            warnings.warn(item.message, item.category, stacklevel=3)


@_warns_at_caller
def load(
    path: str | Path | None = None,
    *,
    device: str | torch.device | None = None,
    precision: AmpName | str = "auto",
    genes: str | Path | None = None,
    perturbations: str | Path | None = None,
    vectors: str | Path | None = None,
    checkpoint: str | None = None,
    use_ema: bool = True,
    tokens_per_forward: int | None = None,
    cuda_graphs: bool | None = None,
    threads: int | None = None,
) -> Model:
    """Load a model for sampling.

    ``path``: a native model directory, an st3 experiment directory, a reference SEDD model
    directory or training run (``None``: the bundled PBMC model). ``device``: default CUDA when
    available, else CPU. ``precision``: the autocast dtype of the model forward ("auto" picks
    bf16 only where it is fast; see docs/precision.md). ``genes`` / ``perturbations`` /
    ``vectors``: side files with gene names, the perturbation name -> index mapping and
    name -> vector file, as ``sedd generate`` takes them. ``checkpoint``: a file inside ``path``
    (st3: ``epoch_3.pt``); ``use_ema=False``: a training run's raw weights.
    ``tokens_per_forward``: rows x genes per model forward (the device's default when None), as
    ``sedd generate --tokens-per-forward`` and the server's ``SEDD_TOKENS_PER_FORWARD``.
    ``cuda_graphs``: replay each forward block from a captured CUDA graph (CUDA only; None:
    ``SEDD_CUDA_GRAPHS``, else off); it never changes a cell. ``threads``: torch threads, set
    where each run starts (None: ``SEDD_THREADS``, else as torch has it); never a cell.
    """
    resolve_threads(threads)  # a bad value is refused here, not at the first run
    if device is None:
        device = default_device()
    loaded = load_checkpoint(
        DEFAULT_MODEL if path is None else path,
        checkpoint=checkpoint,
        use_ema=use_ema,
        genes=genes,
        perturbations=perturbations,
        vectors=vectors,
        device=device,
    )
    policy = resolve_precision(precision, loaded.device)
    graphs = {"tokens_per_forward": tokens_per_forward, "cuda_graphs": cuda_graphs}
    return Model(loaded, policy, **graphs, threads=threads)


class Model:
    """A loaded model and its precision policy; every sampling method returns AnnData.

    The AnnData holds integer counts (CSR int32, cells x the model's genes) in ``.X``, one
    ``obs`` row per cell and the provenance in ``uns["sedd"]`` (sampler, steps, seed, precision
    record, checkpoint hash, timings). ``obs``: the label as ``condition`` and under the model's
    training key (``bulk_labels`` for the bundled model; ``perturbation`` for perturbation
    models), ``condition_idx``, ``sample_idx`` (number within the condition), ``cell_type`` (when
    given), ``seed`` and ``cell_index`` (the cell's random stream). Cells are named
    ``<run id>-<cell index>``, so runs with different seeds concatenate with unique names.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        policy: PrecisionPolicy,
        *,
        tokens_per_forward: int | None = None,
        cuda_graphs: bool | None = None,
        threads: int | None = None,
    ) -> None:
        self.loaded, self.policy, self.tokens_per_forward = loaded, policy, tokens_per_forward
        self.cuda_graphs, self.threads = cuda_graphs, threads
        # one sampler per (precision, rows a forward, CUDA graphs), kept for the model's life:
        # it holds the captured CUDA graphs, which a sampler per call would capture again
        self._samplers: dict[tuple[PrecisionPolicy, int, bool], Sampler] = {}
        self._graphs_lock = threading.Lock()  # replays share static buffers: one run at a time

    def __repr__(self) -> str:
        conditions = f", {len(self.conditions)} conditions" if self.conditions else ""
        return (
            f"sedd.Model({self.loaded.path.name}: {len(self.genes)} genes{conditions}, "
            f"{self.policy.name} on {self.policy.device})"
        )

    @property
    def genes(self) -> list[str]:
        return list(self.loaded.config.genes)

    @property
    def conditions(self) -> list[str]:
        """The perturbation (condition) names the model is conditioned on; [] if unconditional."""
        return self.loaded.conditions

    @property
    def control(self) -> str | None:
        """A perturbation model's control label; None for other models (``default_condition``)."""
        config = self.loaded.config
        return config.control_label if config.label_kind == "perturbation" else None

    @property
    def default_condition(self) -> str | None:
        """The condition a request without one gets (a perturbation model's control)."""
        return self.loaded.config.control_label if self.loaded.conditional else None

    @property
    def cell_types(self) -> list[str]:
        return list(self.loaded.config.cell_types or [])

    @property
    def card(self) -> dict[str, Any]:
        """What ``sedd info`` shows: architecture, parameters, genes, labels, sha256, ..."""
        return model_card_dict(self.loaded)

    @property
    def precision(self) -> dict[str, object]:
        """How forwards run: amp dtype, weight dtype, TF32, device, torch version."""
        record = self.policy.record()
        record.pop("fp32_fallbacks")
        return record

    @_warns_at_caller
    def generate(
        self,
        num_cells: int | None = None,
        *,
        condition: str | Sequence[str] | None = None,
        like: anndata.AnnData | str | Path | None = None,
        condition_key: str | None = None,
        cell_type: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
        sampling: SamplingOptions | None = None,
        **options: Any,
    ) -> anndata.AnnData:
        """``num_cells`` cells per condition.

        Sampling options, by keyword (every method takes them): the fields of
        ``sedd.SamplingOptions``, ``steps``, ``time_grid``, ``sampler`` ("euler", "analytic" or
        "entropy": entropy-bounded adaptive unmasking, ``steps`` its cap on forwards a cell),
        ``entropy_bound``, ``temperature`` and ``seed``; or one
        ``sampling=SamplingOptions.resolve(...)`` value instead. ``steps``, ``time_grid`` and
        ``sampler`` left out give the model's default schedule (its ``calibration.json``, else
        the library's); ``steps`` alone gives that many uniform Euler steps (st3's schedule),
        see ``sedd.defaults``.
        An invalid option raises ``sedd.defaults.OptionError`` (a ``ValueError``) naming it.
        ``batch_size``: cells in flight (memory; never a cell). ``progress``: a progress bar of
        whole cells (None: shown in notebooks, IPython and terminals; every method takes it).

        ``condition``: a name or a list of names (conditional models only); ``None`` means every
        condition the model knows. ``like``: instead of ``num_cells`` and ``condition``, an
        AnnData (or .h5ad path) whose label mix to copy: as many cells of each label as it has
        in obs column ``condition_key`` (default: the model's training key). Same cells as
        ``sedd generate --conditions ... --cells N --seed S`` (``--like FILE``) and the server's
        ``/generate`` for the same parameters.
        """
        sampling = SamplingOptions.of(sampling, options, self.loaded.schedule)
        if like is not None:
            if num_cells is not None or condition is not None:
                raise ValueError("pass `like` or `num_cells`/`condition`, not both.")
            names, counts = label_mix(self.loaded, like, condition_key)
            request = self._request(1, names, cell_type, sampling, condition_counts=counts)
            return self._run(request, progress, batch_size)
        if num_cells is None:
            raise ValueError("`num_cells` must be given (cells per condition), or `like`.")
        names = [condition] if isinstance(condition, str) else condition
        if names is None and self.loaded.conditional:
            names = self.conditions
        return self._run(self._request(num_cells, names, cell_type, sampling), progress, batch_size)

    @_warns_at_caller
    def predict(
        self,
        perturbations: str | Sequence[str] | None,
        *,
        cells_per_perturbation: int = CELLS_PER_PERTURBATION,
        include_control: bool = True,
        control: str | None = None,
        cell_type: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
        sampling: SamplingOptions | None = None,
        **options: Any,
    ) -> anndata.AnnData:
        """``cells_per_perturbation`` cells under each perturbation (default 10, st3's
        ``--num_samples_per_pert``, as ``sedd predict`` and HTTP /predict), plus as many control
        cells (first) unless ``include_control=False``. ``perturbations=None``: every one the
        model knows. Same cells as ``sedd predict``."""
        names = [perturbations] if isinstance(perturbations, str) else perturbations
        conditions = perturbation_conditions(
            self.loaded, names, include_control=include_control, control=control
        )
        sampling = SamplingOptions.of(sampling, options, self.loaded.schedule)
        request = self._request(cells_per_perturbation, conditions, cell_type, sampling)
        return self._run(request, progress, batch_size)

    @_warns_at_caller
    def impute(
        self,
        adata: anndata.AnnData | str | Path,
        *,
        layer: str | None = None,
        condition: str | None = None,
        condition_key: str | None = None,
        cell_type: str | None = None,
        cell_type_key: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        clip: bool = False,
        n_samples: int = 1,
        expected: bool = False,
        progress: bool | None = None,
        sampling: SamplingOptions | None = None,
        **options: Any,
    ) -> anndata.AnnData:
        """Sample the genes ``adata`` does not observe, keeping the counts it does.

        Genes are matched by name: genes the model does not have are reported (a warning) and
        dropped; model genes ``adata`` lacks are sampled. Counts come from ``.X`` or ``layer``
        and must be integers (``clip=True`` clips counts above the vocabulary).

        Conditional models impute each cell under its own label from the obs column
        ``condition_key``, or all under ``condition``; with neither, under each cell's label in
        the model's training key (e.g. ``bulk_labels``) when ``adata`` has that column (a
        warning says so), else under the control. Models with cell types take one for all
        (``cell_type``) or each cell's own from the obs column ``cell_type_key``. The result
        keeps the input's cell names and every obs column (one we also write, with other
        values, as ``input_<name>``), and has ``var["observed"]``. Same cells as ``sedd impute``
        for the same parameters.

        ``n_samples=k`` (1 to 64) samples each cell k times and adds the per-cell, per-gene mean
        of the k draws as ``layers["mean_of_draws"]`` (CSR float32; summed in float64): the
        expected counts given the observed ones, like scvi-tools'
        ``get_normalized_expression(n_samples=k)`` but in counts. ``.X`` stays the first draw,
        identical to ``n_samples=1``; observed genes keep their count in the mean. Draw j of
        cell i draws from stream (seed, j * N + i), N the number of cells, so the layer is fixed
        by the seed; ``uns["sedd"]["n_samples"]`` records k. It costs k times the sampling.

        ``expected=True`` adds ``layers["expected_counts"]`` (CSR float32): per draw, each
        sampled gene's mean count under the distribution it was drawn from (at the temperature
        used), averaged over the k draws: the same expected counts with less noise than
        ``mean_of_draws`` (a Rao-Blackwellised mean). Observed genes hold their count; the cells
        are the same with and without it.
        """
        check_n_samples(n_samples)
        if cell_type is not None and cell_type_key is not None:
            raise ValueError("pass `cell_type` (one for all) or `cell_type_key`, not both.")
        imputation = imputation_from_anndata(self.loaded, adata, layer=layer, clip=clip)
        imputation = with_cell_types(self.loaded, imputation, cell_type_key=cell_type_key)
        dropped_genes_warning(imputation)
        sampling = SamplingOptions.of(sampling, options, self.loaded.schedule)
        conditions, counts = imputation_conditions(
            self.loaded, imputation, condition, condition_key
        )
        cells = imputation.num_cells if counts is None else 1
        request = self._request(cells, conditions, cell_type, sampling, imputation, counts,
                                n_samples=n_samples, expected=expected)  # fmt: skip
        return self._run(request, progress, batch_size)

    def _request(
        self,
        cells_per_condition: int,
        conditions: Sequence[str] | None,
        cell_type: str | None,
        sampling: SamplingOptions,
        imputation: Imputation | None = None,
        condition_counts: Sequence[int] | None = None,
        *,
        n_samples: int = 1,
        expected: bool = False,
    ) -> GenerationRequest:
        """The library's one request type."""
        return GenerationRequest(
            cells_per_condition, conditions, cell_type, sampling,  # type: ignore[arg-type]
            imputation=imputation, condition_counts=condition_counts,  # type: ignore[arg-type]
            n_samples=n_samples, expected=expected,
        )  # fmt: skip

    def _sampler(self, settings: EngineSettings) -> Sampler:
        """This model's sampler for the settings' forward block, built on first use."""
        rows = forward_rows(self.loaded, settings.tokens_per_forward)  # what model_sampler runs
        graphs = cuda_graphs_from_env() if settings.cuda_graphs is None else settings.cuda_graphs
        key = (self.policy, rows, graphs)
        if key not in self._samplers:
            self._samplers[key] = model_sampler(
                self.loaded, self.policy,
                tokens_per_forward=settings.tokens_per_forward, cuda_graphs=graphs,
            )  # fmt: skip
        return self._samplers[key]

    def _run(
        self, request: GenerationRequest, progress: bool | None, batch_size: int
    ) -> anndata.AnnData:
        planned = plan(self.loaded, request)
        settings = EngineSettings(batch_size, self.tokens_per_forward, self.cuda_graphs,
                                  self.threads)  # fmt: skip
        sampler = self._sampler(settings)
        graphs = self._graphs_lock if sampler.graphs.enabled else contextlib.nullcontext()
        show = interactive() if progress is None else progress
        draws = len(planned) * request.n_samples  # the bar counts every draw of a cell
        bar = progress_bar(draws, "sampling") if show else None
        with graphs, bar or contextlib.nullcontext() as on_progress:
            result = run_plan(
                planned, self.policy, on_progress=on_progress, sampler=sampler, settings=settings
            )
        uns = run_provenance(self.loaded, request, self.policy, result.stats, engine=result.engine)
        return cells_anndata(
            result.counts, result.genes, result.obs, uns, var=planned.var(), layers=result.layers
        )
