"""Non-blocking device-to-host copies: a host tensor read before its copy has landed.

On a GPU, ``x.to("cpu", non_blocking=True)`` (and ``x.cpu(non_blocking=True)``) returns at once,
into page-locked memory the copy is still writing: reading it before a sync that orders the copy
(``torch.cuda.synchronize()``, the stream's or a later event's ``synchronize()``, a blocking
readback) reads whatever is there yet, a race that passes on a quiet GPU and fails under load.
The emulator copies at once, so it marks such a result ``PendingHostTensor``: any read of its
values before the emulator's next host sync raises ``ReadBeforeLandedError``; its shape, dtype
and device may be read. Any host sync lands every copy made before it (on a GPU only a sync of
the copy's stream, a later event on it, or the device does: the emulator is lenient there).
Only ``Tensor.to``/``Tensor.cpu`` are modelled: a non-blocking ``copy_`` into a host buffer stays
a (conservative) sync.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

# what may be read of a host tensor whose values are still arriving
_METADATA = frozenset(
    {
        torch.Tensor.size, torch.Tensor.dim, torch.Tensor.__len__, torch.Tensor.numel,
        torch.Tensor.stride, torch.Tensor.element_size, torch.Tensor.is_pinned,
        torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
        torch.Tensor.ndim.__get__, torch.Tensor.is_cuda.__get__, torch.Tensor.layout.__get__,
        torch.Tensor.requires_grad.__get__,
    }
)  # fmt: skip


class ReadBeforeLandedError(RuntimeError):
    """A non-blocking device-to-host copy's values were read before a sync ordered it."""


class PendingHostTensor(torch.Tensor):
    """A host tensor a non-blocking device-to-host copy is writing until the emulator's host sync
    counter passes ``epoch`` (see the module docstring)."""

    emulator: Any
    epoch: int

    @staticmethod
    def of(values: torch.Tensor, emulator: Any) -> PendingHostTensor:
        pending = values.as_subclass(PendingHostTensor)
        pending.emulator, pending.epoch = emulator, emulator.host_epoch
        return pending

    def landed(self) -> bool:
        return bool(self.emulator.host_epoch > self.epoch)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _METADATA:
            for value in tree_flatten((args, kwargs))[0]:
                if isinstance(value, PendingHostTensor) and not value.landed():
                    raise ReadBeforeLandedError(
                        f"read ({getattr(func, '__name__', func)}) of a host tensor that a "
                        "non-blocking device-to-host copy is still writing: on a GPU this reads "
                        "whatever is there yet. Synchronize first (an event recorded after the "
                        "copy, its stream, or torch.cuda.synchronize()), or copy blocking."
                    )
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
