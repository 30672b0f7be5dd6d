"""``EmulatedCudaTensor``: a tensor that reports ``cuda:N`` and keeps its data on a backing device.

A wrapper subclass (``torch.Tensor._make_wrapper_subclass``) with device ``cuda:N``, so its
dispatch keys are CUDA's: torch's real CUDA autocast policy applies to it, ``.numpy()`` refuses
it, ``x.device.type == "cuda"`` holds. Each aten op on it comes to ``__torch_dispatch__``, which
applies what a GPU would (``sedd.cuda_emulation.runtime.Emulator``: a CPU/CUDA mix raises, a
host sync is recorded) and runs the op on the backing tensors (CPU for values, ``meta`` for
shapes only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map, tree_map_only

aten = torch.ops.aten


class EmulatedCudaTensor(torch.Tensor):
    """A ``cuda:N`` tensor whose data is ``backing`` (see the module docstring)."""

    backing: torch.Tensor

    @staticmethod
    def __new__(cls, backing: torch.Tensor, index: int = 0) -> EmulatedCudaTensor:
        if isinstance(backing, EmulatedCudaTensor):
            raise TypeError("an emulated CUDA tensor cannot back another one.")
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            backing.shape,
            strides=backing.stride(),
            storage_offset=backing.storage_offset(),
            dtype=backing.dtype,
            layout=backing.layout,
            device=torch.device("cuda", index),
            requires_grad=backing.requires_grad,
        )
        wrapper.backing = backing
        return wrapper

    def __init__(self, backing: torch.Tensor, index: int = 0) -> None:
        super().__init__()

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, *, tensor_contents: object = None) -> str:  # type: ignore[override]
        # printing or formatting a CUDA tensor copies its values to the host first: a sync
        if _ACTIVE:  # (a tensor kept past its emulation prints without counting)
            _ACTIVE[0].sync("device_to_host", "Tensor.__repr__ (print, f-string, logging)")
        return f"EmulatedCudaTensor(device='{self.device}', backing={self.backing!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled (e.g. torch.save): as a GPU would
        raise TypeError(
            "an emulated CUDA tensor cannot be pickled; move it to the CPU first (.cpu())."
        )

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        emulator = active()
        out = emulator.run_op(func, args, kwargs)
        if func is aten._local_scalar_dense.default:
            return out
        return return_and_correct_aliasing(func, args, kwargs, out)


_ACTIVE: list[Any] = []  # the one emulation under way (sedd.cuda_emulation.emulate_cuda)


def set_active(emulator: Any) -> None:
    """Make ``emulator`` (a ``runtime.Emulator``, or None) the one ops go to."""
    _ACTIVE[:] = [] if emulator is None else [emulator]


def active() -> Any:
    """The emulation under way; an emulated tensor used after it ended raises."""
    if not _ACTIVE:
        raise RuntimeError(
            "an emulated CUDA tensor was used outside sedd.cuda_emulation.emulate_cuda()."
        )
    return _ACTIVE[0]


def unwrap(value: Any) -> Any:
    return value.backing if isinstance(value, EmulatedCudaTensor) else value


def unwrap_all(tree: Any) -> Any:
    return tree_map(unwrap, tree)


def wrap_all(tree: Any, index: int, wrap: Any) -> Any:
    """Every tensor in ``tree`` wrapped as an emulated tensor on ``cuda:index``."""
    return tree_map_only(torch.Tensor, lambda t: wrap(t, index), tree)
