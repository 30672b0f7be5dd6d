"""st3's sampler classes, as thin calls into the engine.

``EulerSampler(model, noise, graph, use_amp, amp_dtype).sample(...)`` keeps st3's constructor and
a readable ``sample`` for notebooks and tests. It has no loop of its own: it submits one job to a
one-off ``Engine`` over this sampler and ticks it to the end, so it walks exactly the time grid,
start tokens and steps the server and the CLI walk. The step maths is
``sedd.diffusion.sampling.Sampler``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sedd.defaults import TimeGrid
from sedd.diffusion.sampling import Predictor, Sampler
from sedd.engine import Engine, EngineJob, JobLimits, JobProgress
from sedd.engine.offline import run_job


class EngineSampler(Sampler):
    """A ``Sampler`` whose ``sample`` runs one job on the engine (see the module docstring)."""

    def sample(
        self,
        num_cells: int | None = None,
        *,
        steps: int,
        seed: int = 0,
        num_genes: int | None = None,
        first_cell: int = 0,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        temperature: float = 1.0,
        x_init: torch.Tensor | None = None,
        fixed: torch.Tensor | None = None,
        denoise: bool = True,
        eps: float = 1e-5,
        time_grid: TimeGrid = "uniform",
        on_step: Callable[[JobProgress], None] | None = None,
    ) -> torch.Tensor:
        """Draw ``num_cells`` sequences of tokens with ``steps`` reverse steps (+ the denoise).

        Cell i draws from its own stream (seed, first_cell + i), whatever else runs with it.
        Imputation: ``x_init`` (N, G) holds given tokens (the mask elsewhere) and ``fixed`` marks
        them; they never change. Time runs over
        ``sedd.diffusion.sampling.time_grid(steps, eps, time_grid)``; with ``denoise`` a last step
        goes to 0. ``on_step`` sees each step's ``JobProgress``.
        Returns (N, G) tokens on the sampler's device.
        """
        if num_cells is None:
            num_cells = next((v.shape[0] for v in (x_init, labels) if v is not None), 0)
        job = EngineJob(
            num_cells=num_cells,
            steps=steps,
            sampler=self.predictor,
            temperature=temperature,
            seed=seed,
            first_cell=first_cell,
            labels=None if labels is None else labels.cpu(),
            cell_types=None if cell_types is None else cell_types.cpu(),
            x_init=None if x_init is None else x_init.cpu(),
            fixed=None if fixed is None else fixed.cpu(),
            eps=eps,
            grid=time_grid,
            denoise=denoise,
        )
        limits = JobLimits.of_module(self.model, num_genes)
        engine = Engine(self, limits, max_rows_per_forward=max(num_cells, 1))
        return run_job(engine, job, on_step).tokens.to(self.device)


class EulerSampler(EngineSampler):
    """Euler reverse step (reference SEDD ``euler`` predictor)."""

    predictor: Predictor = "euler"


class AnalyticSampler(EngineSampler):
    """Analytic (Tweedie tau-leaping) reverse step (reference SEDD ``analytic`` predictor)."""

    predictor: Predictor = "analytic"


class PerturbationEulerSampler(EulerSampler):
    """Euler sampler for perturbation-conditioned models: labels are required.

    ``labels`` are perturbation indices (B,) or precomputed vectors (B, E); ``cell_types``
    optional indices (B,).
    """

    def sample(  # type: ignore[override]
        self, labels: torch.Tensor, *, steps: int, **kwargs: object
    ) -> torch.Tensor:
        if labels is None:
            raise ValueError("PerturbationEulerSampler.sample needs labels (perturbations).")
        return super().sample(labels.shape[0], steps=steps, labels=labels, **kwargs)  # type: ignore[arg-type]
