"""CUDA without a GPU: an emulated CUDA device for a CPU build of torch.

No GPU is lent to this project, so its CUDA path is proven on CPUs: ``emulate_cuda()`` makes
torch report a CUDA device whose tensors (``EmulatedCudaTensor``) keep their data on the CPU
(real values: cells can be compared bit for bit) or on ``meta`` (shapes only: the real K562
shape in seconds, for bytes, FLOPs and memory). Inside the block:

* ``torch.cuda.is_available()`` is true; ``device="cuda"``, ``.to("cuda")`` and
  ``Module.to("cuda")`` make emulated tensors, in every thread;
* ops on them run torch's real CUDA autocast policy (their dispatch keys are CUDA's);
* a CPU/CUDA mix raises as on a GPU; host syncs are recorded with their thread and code site
  (``Emulator.syncs``), and ``torch.cuda.set_sync_debug_mode`` acts on them;
* device memory is counted (``torch.cuda.memory_allocated``, ``max_memory_allocated``,
  ``mem_get_info``) and running past it raises ``torch.OutOfMemoryError``;
* streams, events and CUDA graphs work: a graph records its capture and replays it on the same
  tensors; a sync while capturing, a kernel on a stream that is not capturing, a replay on the
  wrong device and a replay that reads memory freed since the capture all raise.

What it does not model: real kernels and their timings, concurrency between streams (and so
races), multi-GPU semantics beyond device indices, and numerics of CUDA kernels (ops run the CPU
kernels, so bf16 results match the CPU's, not a GPU's).

    with emulate_cuda() as emulator:
        cells = sedd.load(device="cuda", precision="fp32").generate(4, seed=0)
        print(len(emulator.syncs))

``python -m sedd.cuda_emulation MODULE ARGS...`` runs a module (``sedd.cli``, ``pytest``) under
the emulation, like ``python -m``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from sedd.cuda_emulation.cuda_api import patched
from sedd.cuda_emulation.graphs import FreedGraphInputError
from sedd.cuda_emulation.guard import register_fake_cuda_guard
from sedd.cuda_emulation.routing import route_cuda_calls
from sedd.cuda_emulation.runtime import DeviceSpec, EmulatedCudaError, Emulator, Sync
from sedd.cuda_emulation.tensor import EmulatedCudaTensor, active, set_active

__all__ = [
    "DeviceSpec",
    "EmulatedCudaError",
    "EmulatedCudaTensor",
    "Emulator",
    "FreedGraphInputError",
    "Sync",
    "emulate_cuda",
]


@contextlib.contextmanager
def emulate_cuda(
    backing: str = "cpu", devices: Sequence[DeviceSpec] | None = None
) -> Iterator[Emulator]:
    """Emulate CUDA devices (default: one H100) inside the block; yields the ``Emulator``.

    ``backing`` is "cpu" (tensors hold values) or "meta" (shapes only). One emulation at a time.
    """
    if backing not in ("cpu", "meta"):
        raise ValueError(f"`backing` must be 'cpu' or 'meta', got {backing!r}.")
    if _active_or_none() is not None:
        raise RuntimeError("CUDA is already emulated here; nest nothing inside emulate_cuda().")
    if torch.backends.cuda.is_built():
        raise RuntimeError("this torch is a CUDA build: use the real GPU, not the emulator.")
    register_fake_cuda_guard()
    emulator = Emulator(backing, list(devices or [DeviceSpec()]))
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # Module.to("cuda")
    set_active(emulator)
    try:
        with patched(emulator) as streams, route_cuda_calls(emulator):
            emulator.streams = streams
            yield emulator
    finally:
        set_active(None)
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)


def _active_or_none() -> Emulator | None:
    try:
        return active()
    except RuntimeError:
        return None
