"""The device the device-relevant tests run on: ``SEDD_TEST_DEVICE`` (default ``cpu``).

``SEDD_TEST_DEVICE=cuda pytest`` is the CUDA test lane: the engine, the API, batch invariance,
the server, bf16 autocast, the OOM split and CUDA graphs then run on the GPU, and the tests
marked ``needs_cuda`` run at all. ``conftest.py`` refuses the lane in one line where CUDA is
missing.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("SEDD_TEST_DEVICE", "cpu") or "cpu")
ON_CUDA = DEVICE.type == "cuda"

needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="the CUDA lane: SEDD_TEST_DEVICE=cuda")


def lane_problem() -> str | None:
    """Why the requested lane cannot run here, or None."""
    if DEVICE.type not in ("cpu", "cuda"):
        return f"SEDD_TEST_DEVICE must be cpu or cuda, got {DEVICE.type!r}."
    if ON_CUDA and not torch.cuda.is_available():
        return (
            "SEDD_TEST_DEVICE=cuda, but torch sees no CUDA device (a CPU build of torch, or no "
            "GPU): run the lane on a GPU machine, or unset SEDD_TEST_DEVICE."
        )
    return None
