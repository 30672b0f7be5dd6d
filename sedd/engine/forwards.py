"""How a loaded model's forwards run in the engine: the ``Sampler`` that steps its rows.

Every forward runs on fixed blocks of ``block_rows_for(genes, device, tokens_per_forward)`` rows,
so a cell does not depend on what it was packed with; with ``cuda_graphs`` each block step is
replayed from a CUDA graph captured on first use (``sedd.diffusion.cuda_graphs``). The sampler
holds those graphs, so whoever runs engine after engine over one model (the Python API) keeps
one sampler and captures them once.
"""

from __future__ import annotations

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
    rows = block_rows_for(loaded.config.num_genes, loaded.device, tokens_per_forward)
    graphs = cuda_graphs_from_env() if cuda_graphs is None else cuda_graphs
    return Sampler(
        loaded.model, loaded.noise, loaded.graph,
        precision=precision, device=loaded.device, block_rows=rows, cuda_graphs=graphs,
    )  # fmt: skip
