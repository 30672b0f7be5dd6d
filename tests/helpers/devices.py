"""The device the device-relevant tests run on: ``SEDD_TEST_DEVICE`` (default ``cpu``).

``SEDD_TEST_DEVICE=cuda pytest`` is the CUDA test lane: the engine, the API, batch invariance,
the server, bf16 autocast, the OOM split and CUDA graphs then run on the GPU, and the tests
marked ``needs_cuda`` run at all. ``conftest.py`` refuses the lane in one line where CUDA is
missing.

``SEDD_EMULATE_CUDA=1 pytest`` is the same lane on emulated CUDA (``sedd.cuda_emulation``): a
CPU build of torch reports a CUDA device whose tensors keep their data on the CPU, with CUDA's
autocast policy, device-mix errors, recorded host syncs and CUDA graphs. ``conftest.py`` starts
the emulation for the whole session; the device is then ``cuda``.
"""

from __future__ import annotations

import os

import pytest
import torch

EMULATED = os.environ.get("SEDD_EMULATE_CUDA", "").strip().lower() not in ("", "0", "false", "no")
DEVICE = torch.device("cuda" if EMULATED else (os.environ.get("SEDD_TEST_DEVICE", "cpu") or "cpu"))
ON_CUDA = DEVICE.type == "cuda"

needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="the CUDA lane: SEDD_TEST_DEVICE=cuda")
needs_emulator = pytest.mark.skipif(
    not EMULATED, reason="the emulated CUDA lane: SEDD_EMULATE_CUDA=1"
)


def lane_problem() -> str | None:
    """Why the requested lane cannot run here, or None."""
    if DEVICE.type not in ("cpu", "cuda"):
        return f"SEDD_TEST_DEVICE must be cpu or cuda, got {DEVICE.type!r}."
    if EMULATED and torch.backends.cuda.is_built():
        return "SEDD_EMULATE_CUDA=1 needs a CPU build of torch; on a CUDA build run the real lane."
    if ON_CUDA and not EMULATED and not torch.cuda.is_available():
        return (
            "SEDD_TEST_DEVICE=cuda, but torch sees no CUDA device (a CPU build of torch, or no "
            "GPU): run the lane on a GPU machine, or emulate it with SEDD_EMULATE_CUDA=1."
        )
    return None
