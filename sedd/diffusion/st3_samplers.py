"""st3's sampler classes, built on the reference loop (``sedd.diffusion.reference``).

``EulerSampler(model, noise, graph, use_amp, amp_dtype).sample(...)`` keeps st3's constructor and
a readable ``sample`` for notebooks and tests. It checks its arguments as the engine checks a job
(``sedd.diffusion.inputs``) and runs ``reference_sample``: the same time grid, start tokens and
steps the server and the CLI walk, one request at a time. The step maths is
``sedd.diffusion.sampling.Sampler``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sedd.defaults import SamplingOptions, TimeGrid
from sedd.diffusion.inputs import ModelLimits, check_inputs
from sedd.diffusion.reference import StepProgress, reference_sample
from sedd.diffusion.sampling import Predictor, Sampler


class St3Sampler(Sampler):
    """A ``Sampler`` with st3's ``sample`` (see the module docstring)."""

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
        on_step: Callable[[StepProgress], None] | None = None,
    ) -> torch.Tensor:
        """Draw ``num_cells`` sequences of tokens with ``steps`` reverse steps (+ the denoise).

        Cell i draws from its own stream (seed, first_cell + i). Imputation: ``x_init`` (N, G)
        holds given tokens (the mask elsewhere) and ``fixed`` marks them; they never change.
        Time runs over ``sedd.diffusion.sampling.time_grid(steps, eps, time_grid)``; with
        ``denoise`` a last step goes to 0. ``on_step`` sees each step's ``StepProgress``.
        Returns (N, G) tokens on the sampler's device.
        """
        if num_cells is None:
            num_cells = next((v.shape[0] for v in (x_init, labels) if v is not None), 0)
        options = SamplingOptions(steps, time_grid, self.predictor, temperature, seed)
        limits = ModelLimits.of_module(self.model, num_genes)
        inputs = dict(labels=labels, cell_types=cell_types, fixed=fixed)
        cpu = {k: None if v is None else v.cpu() for k, v in inputs.items()}
        check_inputs(
            limits, self.graph, num_cells=num_cells, first_cell=first_cell, eps=eps,
            x_init=None if x_init is None else x_init.cpu(), **cpu,
        )  # fmt: skip
        return reference_sample(
            self, x_init, options, num_cells=num_cells, num_genes=limits.num_genes,
            first_cell=first_cell, eps=eps, denoise=denoise, on_step=on_step, **inputs,
        )  # fmt: skip


class EulerSampler(St3Sampler):
    """Euler reverse step (reference SEDD ``euler`` predictor)."""

    predictor: Predictor = "euler"


class AnalyticSampler(St3Sampler):
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
