"""The reference sampler: one request's cells, a plain loop over the time grid. Read this first.

This is the executable spec of sampling, written as the reference SEDD code and diffusers
pipelines read: start tokens at t = 1, one ``Sampler.step`` per pair of times on
``time_grid(steps, eps, options.time_grid)``, then the denoise from eps to 0. Every kind of step
(``sedd.diffusion.steps``) runs here: an adaptive one (entropy-bounded unmasking) reads each
cell's time off its own tokens, takes at most ``steps`` forwards and ends when every cell is
done. The batching engine
(``sedd.engine``) runs the same steps for many requests at once, packing their rows into shared
forwards; ``tests/engine/test_engine_equals_reference.py`` checks that its cells equal this
loop's bit for bit, for every sampler, grid, conditioning and imputation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sedd.defaults import SamplingOptions
from sedd.diffusion.sampling import Sampler, StepRows, start_tokens, time_grid
from sedd.diffusion.steps import kind_index, step_kind


@dataclass
class StepProgress:
    """Where a request is after a step (what a progress hook sees)."""

    step: int  # steps done by every row; the final denoise is step == steps
    steps: int  # the most there are, the denoise included (an adaptive sampler's cap)
    rows: int  # rows this step moved
    fraction_masked: float  # of all positions, those that can still change (0: uniform graph)
    finished: int = 0  # cells that finished with this step (a progress bar counts them)
    # of the genes the request draws, the share drawn (under the uniform graph: step / steps)
    fraction_unmasked: float = 0.0


def reference_sample(
    sampler: Sampler,
    x: torch.Tensor | None,
    options: SamplingOptions,
    *,
    num_cells: int,
    num_genes: int | None = None,
    first_cell: int = 0,
    eps: float = 1e-5,
    denoise: bool = True,
    fixed: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    cell_types: torch.Tensor | None = None,
    on_step: Callable[[StepProgress], None] | None = None,
) -> torch.Tensor:
    """(num_cells, genes) tokens sampled as ``options`` say (steps, time grid, the reverse step,
    temperature, seed): cell i of the request draws from stream (seed, first_cell + i).

    ``x`` holds the start tokens of an imputation (the mask where a gene is to be drawn; ``fixed``
    marks the given genes, which never change); ``None`` starts every gene at t = 1.
    """
    seed, steps = options.seed, options.steps
    device = sampler.device
    if x is None:
        x = start_tokens(sampler.graph, num_cells, num_genes or 0, device, seed=seed,
                         first_cell=first_cell)  # fmt: skip
    x = x.to(device=device, dtype=torch.long)
    fixed, labels, cell_types = (
        None if v is None else v.to(device) for v in (fixed, labels, cell_types)
    )
    kind = step_kind(options.sampler)
    total = kind.forwards(steps, denoise)
    if not kind.adaptive:  # a kind on the time grid
        times = time_grid(steps, eps, options.time_grid).tolist()
        pairs = list(itertools.pairwise(times)) + ([(times[-1], 0.0)] if denoise else [])
    else:  # each row's time is its own; t and s here are unused
        pairs = [(1.0, 1.0)] * total
    to_draw = int(sampler._active(x, fixed).sum()) if sampler.graph.absorb else 0
    busy = num_cells  # cells not finished
    for step, (t, s) in enumerate(pairs):
        rows = StepRows.of_request(
            x, t, s, seed=seed, first_cell=first_cell, step=step, temperature=options.temperature,
            kind=kind_index(options.sampler), entropy_bound=options.entropy_bound,
            steps_left=total - step, fixed=fixed, labels=labels, cell_types=cell_types,
        )  # fmt: skip
        out = sampler.step(rows)
        x = out.tokens
        left = int(out.active.sum()) if sampler.graph.absorb and out.active is not None else 0
        if on_step is not None:
            # a cell finishes when its last gene is drawn (an adaptive kind) or at the last step
            still = int((out.active > 0).sum()) if kind.adaptive else num_cells
            still = 0 if step + 1 == len(pairs) else still
            drawn = 1 - left / to_draw if to_draw else (step + 1) / len(pairs)
            on_step(StepProgress(step + 1, len(pairs), num_cells, left / max(x.numel(), 1),
                                 busy - still, drawn))  # fmt: skip
            busy = still
        if kind.adaptive and not left:  # every cell is done: its job ends here
            break
    return x
