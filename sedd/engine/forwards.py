"""The shape of the engine's model forwards, decided here and nowhere else.

Every forward runs on fixed blocks of ``block_rows`` rows (the last padded with copies of its last
row), so a cell does not depend on what it was packed with. This module decides how many:

* ``block_rows_for``: a token budget (``tokens_per_forward``, rows x genes; the device's
  ``DEFAULT_TOKENS_PER_FORWARD`` when unset) divided by the genes, at least one row.
* ``forward_rows``: that, and on CUDA with no budget set, also bounded by the device's free memory
  (``rows_that_fit``): a block step's peak grows with genes x vocabulary per row (fp32 logits and
  probabilities, an fp64 draw: ``step_bytes``), and every forward runs on whole blocks, so only a
  smaller block lowers it.
* ``model_sampler``: the ``Sampler`` over a loaded model that steps its rows on those blocks;
  with ``cuda_graphs`` each block step is replayed from a CUDA graph captured on first use
  (``sedd.diffusion.cuda_graphs``). The sampler holds those graphs, so whoever runs engine after
  engine over one model (the Python API) keeps one sampler and captures them once.
* ``ForwardShape``: what an engine's forwards ran on (``Engine.forward_shape``), for provenance.

The lower layers take the rows as given: ``Sampler(block_rows=...)`` cuts its rows into blocks
with ``sedd.precision.fixed_blocks``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sedd.checkpoints import LoadedModel
from sedd.diffusion.cuda_graphs import cuda_graphs_from_env
from sedd.diffusion.sampling import Sampler
from sedd.precision import PrecisionPolicy

log = logging.getLogger(__name__)

# Tokens (rows x genes) per model forward when none is set: the forward's fixed row block. On CPU
# a 765-gene row costs the same at 1 to 10 rows a forward (33-35 ms in fp32), so the block is one
# such row and a one-cell request pays for no padding; small models still get several rows. On
# a GPU the cost of a forward is mostly fixed, and larger blocks fill it.
DEFAULT_TOKENS_PER_FORWARD = {"cpu": 1024, "cuda": 131072}

# A block step's peak device memory per row, per gene x vocabulary token: measured 16.8 B at the
# K562 shape and 17.0 B at 2,000 genes with its vocabulary on the emulated lane's meta backing
# (tests/engine/test_block_memory.py), with the two-level fp64 draw (no fp64 CDF over the whole
# vocabulary: 23.4 and 27.9 B before); the larger, rounded up.
STEP_BYTES_PER_TOKEN = 18
FREE_MEMORY_SHARE = 0.8  # of the free memory, for one block step; the rest for the allocator


@dataclass(frozen=True)
class ForwardShape:
    """What every model forward of an engine runs on: ``rows`` rows (None: no fixed block, a
    forward takes a step's rows) and ``tokens_per_forward`` = rows x genes (None where either is
    not known). The tokens are the rows' own, not the budget asked for: 1,024 tokens of 765-gene
    cells run one row, 765 tokens, a forward."""

    rows: int | None
    tokens_per_forward: int | None

    @classmethod
    def of(cls, rows: int | None, genes: int | None) -> ForwardShape:
        return cls(rows, None if rows is None or genes is None else rows * genes)


def block_rows_for(
    num_genes: int, device: torch.device | str, tokens_per_forward: int | None = None
) -> int:
    """Rows per model forward for a token budget (at least 1): every forward runs on blocks of
    exactly this many rows, so a cell's numbers do not depend on its batch."""
    budget = tokens_per_forward
    if budget is None:
        budget = DEFAULT_TOKENS_PER_FORWARD.get(torch.device(device).type, 32768)
    if budget < 1:
        raise ValueError(f"`tokens_per_forward` must be >= 1, got {budget}.")
    return max(1, budget // max(num_genes, 1))


def forward_rows(loaded: LoadedModel, tokens_per_forward: int | None = None) -> int:
    """The rows of every forward over ``loaded`` on its device (see the module docstring). A
    budget set by hand is kept, with a warning when its block step would not fit the free
    memory (the estimate is rounded up, so it may yet fit)."""
    genes = loaded.config.num_genes
    rows = block_rows_for(genes, loaded.device, tokens_per_forward)
    if loaded.device.type != "cuda":
        return rows
    free, _ = torch.cuda.mem_get_info(loaded.device)
    fit = rows_that_fit(genes, loaded.graph.dim, free)
    if tokens_per_forward is None:
        return min(rows, fit)
    if rows > fit:
        log.warning(
            "tokens_per_forward %d: a block step of %d rows needs about %.1f GiB, over %d%% of "
            "the %.1f GiB free on %s; it may run out of memory. Lower --tokens-per-forward "
            "(SEDD_TOKENS_PER_FORWARD) to %d, or leave it unset to size blocks from free memory.",
            tokens_per_forward, rows, step_bytes(rows, genes, loaded.graph.dim) / 2**30,
            round(FREE_MEMORY_SHARE * 100), free / 2**30, loaded.device, fit * genes,
        )  # fmt: skip
    return rows


def step_bytes(rows: int, num_genes: int, vocab_size: int) -> int:
    """Estimated peak device memory of one block step of ``rows`` rows."""
    return rows * num_genes * vocab_size * STEP_BYTES_PER_TOKEN


def rows_that_fit(num_genes: int, vocab_size: int, free_bytes: int) -> int:
    """The most rows whose block step fits in ``FREE_MEMORY_SHARE`` of ``free_bytes`` (>= 1)."""
    return max(1, int(free_bytes * FREE_MEMORY_SHARE) // step_bytes(1, num_genes, vocab_size))


def model_sampler(
    loaded: LoadedModel,
    precision: PrecisionPolicy,
    *,
    tokens_per_forward: int | None = None,
    cuda_graphs: bool | None = None,
) -> Sampler:
    """The sampler over ``loaded`` under ``precision``, on blocks of ``forward_rows`` rows.

    ``tokens_per_forward``: rows x genes a forward (None: the device's default).
    ``cuda_graphs``: replay block steps from CUDA graphs on CUDA (None: ``SEDD_CUDA_GRAPHS``, off
    when unset); it never changes a cell.
    """
    rows = forward_rows(loaded, tokens_per_forward)
    graphs = cuda_graphs_from_env() if cuda_graphs is None else cuda_graphs
    return Sampler(
        loaded.model, loaded.noise, loaded.graph,
        precision=precision, device=loaded.device, block_rows=rows, cuda_graphs=graphs,
    )  # fmt: skip
