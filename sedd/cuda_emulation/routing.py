"""Routing ``device="cuda"`` to the emulator, in every thread.

A CPU build of torch refuses ``device="cuda"`` in its Python bindings before any dispatch, so
the calls that name the device are caught one level up, by a ``TorchFunctionMode``: factories
with ``device=`` (``torch.zeros``, ``torch.arange``, ``torch.tensor``...), ``Tensor.to``,
``Tensor.cuda``, ``pin_memory`` and ``is_pinned``. Everything else an emulated tensor does goes
through its ``__torch_dispatch__``.

A ``TorchDispatchMode`` catches the aten factories torch's C++ makes on a CUDA device by itself.
Modes are per thread: ``routing(emulator)`` enters the mode in the calling thread and in every
thread started inside the block (the engine's, uvicorn's, worker pools'), so code on any thread
sees the same emulated CUDA.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from sedd.cuda_emulation.runtime import Emulator
from sedd.cuda_emulation.tensor import EmulatedCudaTensor

_UPLOADING = (torch.tensor, torch.as_tensor, torch.asarray)
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def _host_lists(index: Any) -> Any:
    """Python lists in an index as CPU tensors: torch builds them on the indexed tensor's device
    below any mode, which a CPU build cannot; a CPU index then uploads, as on a GPU."""
    if isinstance(index, list) and all(isinstance(i, int | bool) for i in index):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(_host_lists(i) for i in index)
    return index


def _is_cuda(device: Any) -> bool:
    if device is None or isinstance(device, int):
        return False
    return torch.device(device).type == "cuda"


class DeviceRouting(TorchFunctionMode):
    """Sends calls that name a CUDA device to the emulator (see the module docstring)."""

    def __init__(self, emulator: Emulator) -> None:
        super().__init__()
        self.emulator = emulator

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch._C._nn._parse_to:  # names a device, makes no tensor
            return func(*args, **kwargs)
        if func is torch.Tensor.to:
            return self._to(args[0], *torch._C._nn._parse_to(*args[1:], **kwargs), kwargs)
        if func is torch.Tensor.cuda:
            device = args[1] if len(args) > 1 else kwargs.get("device")
            device = torch.device("cuda") if device is None else torch.device("cuda", device) \
                if isinstance(device, int) else torch.device(device)  # fmt: skip
            return self._to(args[0], device, None, kwargs.get("non_blocking", False), None, {})
        if func in _INDEXING and isinstance(args[0], EmulatedCudaTensor):
            args = (args[0], _host_lists(args[1]), *args[2:])
        if func is torch.Tensor.numpy and isinstance(args[0], EmulatedCudaTensor):
            raise TypeError(
                f"can't convert {args[0].device} device type tensor to numpy. Use Tensor.cpu() "
                "to copy the tensor to host memory first."
            )
        if func is torch.Tensor.tolist and isinstance(args[0], EmulatedCudaTensor):
            return args[0].cpu().tolist()  # a device-to-host copy, as on a GPU
        if func is torch.Tensor.pin_memory:
            return self.emulator.pin(args[0].clone())
        if func is torch.Tensor.is_pinned:
            return not isinstance(args[0], EmulatedCudaTensor) and self.emulator.is_pinned(args[0])
        if kwargs.get("pin_memory"):
            return self.emulator.pin(func(*args, **{**kwargs, "pin_memory": False}))
        if _is_cuda(kwargs.get("device")):
            return self._factory(func, args, kwargs)
        return func(*args, **kwargs)

    def _to(
        self,
        tensor: torch.Tensor,
        device: torch.device | None,
        dtype: torch.dtype | None,
        non_blocking: bool,
        memory_format: torch.memory_format | None,
        kwargs: dict,
    ) -> torch.Tensor:
        copy = bool(kwargs.get("copy", False))
        memory_format = memory_format or torch.preserve_format
        plain = dict(dtype=dtype or tensor.dtype, copy=copy, memory_format=memory_format)
        if not _is_cuda(device):
            if device is None:
                return tensor.to(**plain, non_blocking=non_blocking)
            return tensor.to(device=device, **plain, non_blocking=non_blocking)
        emulator = self.emulator
        index = emulator.index_of(device)
        if isinstance(tensor, EmulatedCudaTensor):
            if tensor.device.index == index:
                return tensor.to(**plain, non_blocking=non_blocking)
            moved = tensor.backing.to(dtype=plain["dtype"], copy=True)  # device to device
            return self._made(lambda: moved, index)
        if tensor.device.type == "meta" and emulator.backing == "meta":  # shapes only
            return self._made(lambda: tensor.detach().to(dtype=plain["dtype"], copy=True), index)
        if tensor.device.type != "cpu":
            raise RuntimeError(f"the emulator moves CPU tensors to CUDA, got {tensor.device}")
        if not (non_blocking and emulator.is_pinned(tensor)):
            emulator.sync("host_to_device", "Tensor.to")
        source = tensor.detach()
        return self._made(lambda: source.to(dtype=plain["dtype"], copy=True), index,
                          requires_grad=tensor.requires_grad)  # fmt: skip

    def _factory(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        emulator = self.emulator
        index = emulator.index_of(kwargs["device"])
        owner = args[0] if args else None
        if isinstance(owner, EmulatedCudaTensor):  # x.new_zeros(..., device="cuda:i")
            rest = {k: v for k, v in kwargs.items() if k != "device"}
            if owner.device.index != index:
                raise RuntimeError("the emulator makes new_* tensors on their owner's device")
            return func(*args, **rest)
        if func in _UPLOADING:
            emulator.sync("host_to_device", getattr(func, "__name__", str(func)))
        local = {**kwargs, "device": torch.device(emulator.backing)}
        return self._made(lambda: func(*args, **local), index)

    def _made(self, make: Callable[[], Any], index: int, *, requires_grad: bool = False) -> Any:
        """Run ``make`` (a backing-device computation) and wrap what it returns on
        ``cuda:index``; during a capture by this thread it is recorded for replay."""
        emulator = self.emulator
        emulator.count_launch("a tensor made on the device")
        capture = emulator.capture
        if capture is not None:
            capture.check_launch(emulator, index)
        out = make()

        def wrap(t: torch.Tensor) -> torch.Tensor:
            wrapped = emulator.wrap(t, index)
            return wrapped.requires_grad_() if requires_grad else wrapped

        result = tree_map_only(torch.Tensor, wrap, out)
        if capture is not None and capture.thread == threading.get_ident():
            capture.record_call(make, result)
        return result


class DeviceFactories(TorchDispatchMode):
    """Sends aten factories that name a CUDA device and take no CUDA tensor to the emulator:
    the ones torch's C++ makes itself (``torch.where(cond, 0.0, x)`` wraps its scalar on the
    condition's device)."""

    def __init__(self, emulator: Emulator, routing: DeviceRouting) -> None:
        super().__init__()
        self.emulator, self.routing = emulator, routing

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if _is_cuda(kwargs.get("device")) and not any(
            isinstance(t, EmulatedCudaTensor) for t in tree_flatten((args, kwargs))[0]
        ):
            index = self.emulator.index_of(kwargs["device"])
            local = {**kwargs, "device": torch.device(self.emulator.backing)}
            return self.routing._made(lambda: func(*args, **local), index)
        return func(*args, **kwargs)


@contextlib.contextmanager
def route_cuda_calls(emulator: Emulator) -> Iterator[None]:
    """``DeviceRouting`` in this thread and in every thread started inside the block."""
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def modes() -> Iterator[None]:
        routing = DeviceRouting(emulator)
        with routing, DeviceFactories(emulator, routing):
            yield

    def inner(thread: threading.Thread) -> None:
        with modes():
            bootstrap(thread)

    with mock.patch.object(threading.Thread, "_bootstrap_inner", inner), modes():
        yield
