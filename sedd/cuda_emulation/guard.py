"""A CUDA device guard for a CPU build of torch: c10's ``FakeGuardImpl`` registered for CUDA.

Some of torch's C++ code opens a device guard for a tensor's device (``c10::DeviceGuard``). A CPU
build has no guard implementation for CUDA, so that code fails on a tensor that reports
``cuda:0`` even when its data lives on the CPU. c10 ships a fake implementation for tests
(``c10/core/impl/FakeGuardImpl.h``: it tracks a current device index and does nothing else);
this module compiles a few lines that put it in c10's registry, once per machine and torch
version (``torch.utils.cpp_extension.load_inline``; the build is cached in torch's extension
directory).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

_SOURCE = r"""
#include <torch/extension.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
// Lives for the whole process, as c10's registry expects of a guard implementation.
c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> emulated_cuda_guard;
}

bool register_emulated_cuda_guard() {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  if (slot.load() != nullptr) {
    return false;  // a real CUDA build (or an earlier call) already has one
  }
  slot.store(&emulated_cuda_guard);
  return true;
}
"""


@functools.cache
def register_fake_cuda_guard() -> bool:
    """Register the fake CUDA guard (compiling it on first use); True if it was registered now.

    Raises ``RuntimeError`` with what to install when no C++ compiler or ninja is found."""
    from torch.utils.cpp_extension import get_default_build_root, load_inline

    name = "sedd_emulated_cuda_guard_" + torch.__version__.replace(".", "_").replace("+", "_")
    # One build per torch installation: the build file names torch's include paths, so two
    # environments sharing one directory rebuilt it (about 20 s) each time the other had run.
    install = hashlib.sha256(str(Path(torch.__file__).resolve().parent).encode()).hexdigest()[:12]
    build = Path(get_default_build_root()) / f"{name}_{install}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        module = load_inline(
            name, cpp_sources=_SOURCE, functions=["register_emulated_cuda_guard"],
            build_directory=str(build), verbose=False,
        )  # fmt: skip
    except (RuntimeError, OSError) as err:
        raise RuntimeError(
            "the emulated CUDA lane needs a C++ compiler (g++) and ninja to build its device "
            f"guard: install them (pip install ninja), then retry ({type(err).__name__}: {err})."
        ) from err
    return bool(module.register_emulated_cuda_guard())
