"""How a loaded model's forwards run in the engine: the ``Sampler`` that steps its rows.

Every forward runs on fixed blocks of ``block_rows_for(genes, device, tokens_per_forward)`` rows,
so a cell does not depend on what it was packed with; with ``cuda_graphs`` each block step is
replayed from a CUDA graph captured on first use (``sedd.diffusion.cuda_graphs``). The sampler
holds those graphs, so whoever runs engine after engine over one model (the Python API) keeps
one sampler and captures them once.

On CUDA the default block is also bounded by the device's free memory: a block step's peak grows
with genes x vocabulary per row (fp32 logits and probabilities, an fp64 CDF: 330 MiB a row at
the K562 shape, 8,563 genes x 1,725 tokens, measured on the emulated lane's meta backing), and
every forward runs on whole blocks, so only a smaller block lowers it.
"""

from __future__ import annotations

import torch

from sedd.checkpoints import LoadedModel
from sedd.diffusion.cuda_graphs import cuda_graphs_from_env
from sedd.diffusion.sampling import Sampler, block_rows_for
from sedd.precision import PrecisionPolicy


def model_sampler(
    loaded: LoadedModel,
    precision: PrecisionPolicy,
    *,
    tokens_per_forward: int | None = None,
    cuda_graphs: bool | None = None,
) -> Sampler:
    """The sampler over ``loaded`` under ``precision`` (see the module docstring).

    ``tokens_per_forward``: rows x genes a forward (None: the device's default).
    ``cuda_graphs``: replay block steps from CUDA graphs on CUDA (None: ``SEDD_CUDA_GRAPHS``, off
    when unset); it never changes a cell.
    """
    genes = loaded.config.num_genes
    rows = block_rows_for(genes, loaded.device, tokens_per_forward)
    if tokens_per_forward is None and loaded.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(loaded.device)
        rows = min(rows, rows_that_fit(genes, loaded.graph.dim, free))
    graphs = cuda_graphs_from_env() if cuda_graphs is None else cuda_graphs
    return Sampler(
        loaded.model, loaded.noise, loaded.graph,
        precision=precision, device=loaded.device, block_rows=rows, cuda_graphs=graphs,
    )  # fmt: skip


# A block step's peak device memory per row, per gene x vocabulary token: measured 16.8 B at the
# K562 shape and 17.0 B at 2,000 genes with its vocabulary on the emulated lane's meta backing
# (tests/engine/test_block_memory.py), with the two-level fp64 draw (no fp64 CDF over the whole
# vocabulary: 23.4 and 27.9 B before); the larger, rounded up.
STEP_BYTES_PER_TOKEN = 18
FREE_MEMORY_SHARE = 0.8  # of the free memory, for one block step; the rest for the allocator


def step_bytes(rows: int, num_genes: int, vocab_size: int) -> int:
    """Estimated peak device memory of one block step of ``rows`` rows."""
    return rows * num_genes * vocab_size * STEP_BYTES_PER_TOKEN


def rows_that_fit(num_genes: int, vocab_size: int, free_bytes: int) -> int:
    """The most rows whose block step fits in ``FREE_MEMORY_SHARE`` of ``free_bytes`` (>= 1)."""
    return max(1, int(free_bytes * FREE_MEMORY_SHARE) // step_bytes(1, num_genes, vocab_size))
