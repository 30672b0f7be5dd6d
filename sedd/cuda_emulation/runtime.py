"""The emulator's state and its rules for one aten op on emulated CUDA tensors.

``Emulator.run_op`` is what every op on an ``EmulatedCudaTensor`` comes to. It does what a GPU
would, where that is observable from the host:

* **device mixes raise**: a CUDA tensor with a CPU tensor (other than a 0-dim one) in one op, or
  two different CUDA devices, raise torch's own message; copies and CPU index tensors are allowed
  (as on a GPU), and counted when they make the host wait;
* **host syncs are recorded** (``Sync``: kind, op, thread, where in the code): ``.item()``,
  ``bool(t)``, ``nonzero``, ``masked_select``, ``unique``, ``equal``, boolean indexing,
  device-to-host copies, pageable host-to-device copies (pinned, non-blocking ones are not
  syncs), ``synchronize``; ``torch.cuda.set_sync_debug_mode`` acts on them as CUDA's does;
* **memory is counted** per device, like the caching allocator's ``memory_allocated``: a storage
  counts from its first tensor until its last one dies; past the device's memory an allocation
  raises ``torch.OutOfMemoryError``;
* **graph capture** (``sedd.cuda_emulation.graphs``): the capturing thread's ops are recorded for
  replay; a sync while capturing raises as CUDA does. Views follow inference mode as on a GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import traceback
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from sedd.cuda_emulation.attention import flash_eligibility
from sedd.cuda_emulation.host_copies import PendingHostTensor
from sedd.cuda_emulation.tensor import EmulatedCudaTensor, unwrap_all, wrap_all

aten = torch.ops.aten
GiB = 1 << 30

# ops that make the host wait for the device, by overload packet
_SYNC_OPS = {
    aten._local_scalar_dense: "item",
    aten.nonzero: "nonzero",
    aten.masked_select: "masked_select",
    aten.equal: "equal",
    aten.is_nonzero: "item",
    aten._unique: "unique",
    aten._unique2: "unique",
    aten.unique_dim: "unique",
    aten.unique_consecutive: "unique",
    aten.unique_dim_consecutive: "unique",
}
_COPIES = {aten._to_copy, aten.copy_, aten.copy}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


class EmulatedCudaError(RuntimeError):
    """What a GPU would have failed on (a capture broken by a sync, a freed graph input...)."""


@dataclass(frozen=True)
class Sync:
    """One host sync: what, which op, on which thread, and the first project frame that did it."""

    kind: str  # item, nonzero, device_to_host, host_to_device, synchronize, ...
    op: str
    thread: str
    thread_id: int
    where: str


@dataclass
class _Storage:
    nbytes: int
    device: int
    refs: int = 0
    generation: int = 0


@dataclass
class DeviceSpec:
    """What one emulated GPU reports."""

    name: str = "NVIDIA H100 80GB HBM3 (emulated)"
    capability: tuple[int, int] = (9, 0)
    total_memory: int = 80 * GiB
    multi_processor_count: int = 132


def _site() -> str:
    """The innermost frame of this project outside the emulator, as ``path:line in function``."""
    for frame in reversed(traceback.extract_stack()):
        name = frame.filename.replace("\\", "/")
        if "/sedd/cuda_emulation/" in name or "/torch/" in name:
            continue
        if "/sedd/" in name or "/server/" in name or "/tests/" in name or "/scripts/" in name:
            return f"{name.split('/')[-2]}/{name.split('/')[-1]}:{frame.lineno} in {frame.name}"
    return "?"


@dataclass
class Emulator:
    """The state of an emulated CUDA runtime (built by ``sedd.cuda_emulation.emulate_cuda``)."""

    backing: str = "cpu"  # where tensors keep their data: "cpu" (values) or "meta" (shapes)
    devices: list[DeviceSpec] = field(default_factory=lambda: [DeviceSpec()])
    syncs: list[Sync] = field(default_factory=list)
    ops_by_thread: Counter[int] = field(default_factory=Counter)
    op_sites: dict[int, str] = field(default_factory=dict)  # thread id -> its first op's site
    sync_debug_mode: int = 0  # 0 off, 1 warn, 2 error (torch.cuda.set_sync_debug_mode)
    allocated: list[int] = field(default_factory=list)
    peak: list[int] = field(default_factory=list)
    capture: Any = None  # the graph being captured (sedd.cuda_emulation.graphs), if any
    observers: list[Any] = field(default_factory=list)  # called as fn(func, args, kwargs, out)
    attention: list[str] = field(default_factory=list)  # per SDPA call: "flash" or why not
    host_epoch: int = 0  # host syncs that land pending copies (sedd.cuda_emulation.host_copies)

    def __post_init__(self) -> None:
        self.allocated = [0] * len(self.devices)
        self.peak = [0] * len(self.devices)
        self._storages: dict[int, _Storage] = {}
        self._generations = itertools.count(1)
        self._pinned: dict[int, weakref.ref] = {}
        self._lock = threading.RLock()
        self.tls = threading.local()

    # ---- devices and streams of the calling thread ------------------------------------------

    def current_device(self) -> int:
        return getattr(self.tls, "device", 0)

    def set_device(self, index: int) -> None:
        self.check_index(index)
        self.tls.device = index

    def check_index(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise RuntimeError(
                f"CUDA error: invalid device ordinal {index} (the emulator has "
                f"{len(self.devices)} device(s))"
            )
        return index

    def index_of(self, device: torch.device | str | int | None) -> int:
        """The CUDA device index ``device`` means on this thread ("cuda" is the current one)."""
        if device is None:
            return self.current_device()
        if isinstance(device, int):
            return self.check_index(device)
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"expected a CUDA device, got {device}.")
        return self.check_index(self.current_device() if device.index is None else device.index)

    # ---- tensors and memory ------------------------------------------------------------------

    def wrap(self, backing: torch.Tensor, index: int) -> EmulatedCudaTensor:
        """``backing`` as a tensor on ``cuda:index``, its storage counted as device memory."""
        if self.backing == "meta" and backing.device.type != "meta":
            backing = backing.to("meta")
        tensor = EmulatedCudaTensor(backing, index)
        storage = backing.untyped_storage()
        key = storage._cdata
        with self._lock:
            entry = self._storages.get(key)
            if entry is None:
                nbytes = storage.nbytes()
                free = self.devices[index].total_memory - self.allocated[index]
                if nbytes > free:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB. GPU "
                        f"{index} has a total capacity of "
                        f"{self.devices[index].total_memory / GiB:.2f} GiB of which "
                        f"{free / 2**20:.2f} MiB is free (emulated)."
                    )
                entry = self._storages[key] = _Storage(nbytes, index, 0, next(self._generations))
                self.allocated[index] += nbytes
                self.peak[index] = max(self.peak[index], self.allocated[index])
                if self.capture is not None:
                    self.capture.pool_storages.add((key, entry.generation))
            entry.refs += 1
        weakref.finalize(tensor, self._release, key, entry.generation)
        return tensor

    def _release(self, key: int, generation: int) -> None:
        with self._lock:
            entry = self._storages.get(key)
            if entry is None or entry.generation != generation:
                return
            entry.refs -= 1
            if entry.refs == 0:
                del self._storages[key]
                self.allocated[entry.device] -= entry.nbytes

    def storage_id(self, tensor: EmulatedCudaTensor) -> tuple[int, int]:
        """(key, generation) of the storage behind ``tensor``, while it is alive."""
        key = tensor.backing.untyped_storage()._cdata
        with self._lock:
            entry = self._storages.get(key)
            return key, (entry.generation if entry else 0)

    def storage_alive(self, ident: tuple[int, int]) -> bool:
        with self._lock:
            entry = self._storages.get(ident[0])
            return entry is not None and entry.generation == ident[1]

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mark a CPU tensor's memory as page-locked (``pin_memory``): copies from it to the
        device with ``non_blocking=True`` are then asynchronous, not syncs."""
        key = tensor.untyped_storage().data_ptr()
        with self._lock:
            self._pinned[key] = weakref.ref(tensor)
        return tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        key = tensor.untyped_storage().data_ptr()
        with self._lock:
            ref = self._pinned.get(key)
            owner = None if ref is None else ref()
        return owner is not None and owner.untyped_storage().data_ptr() == key

    # ---- syncs -------------------------------------------------------------------------------

    def sync(self, kind: str, op: str, debug_mode_sees: bool = True) -> None:
        """Record a host sync; raise if a capture is under way (as CUDA does) or if the sync
        debug mode says so (it never sees device or event synchronizes, as on CUDA)."""
        thread = threading.current_thread()
        record = Sync(kind, op, thread.name, thread.ident or 0, _site())
        with self._lock:
            self.syncs.append(record)
            self.host_epoch += kind != "host_to_device"  # the host waited for the device
        capture = self.capture
        if capture is not None and (capture.mode == "global" or capture.thread == thread.ident):
            raise EmulatedCudaError(
                f"CUDA error: operation not permitted when stream is capturing ({kind} in {op} "
                f"at {record.where}, thread {record.thread})"
            )
        if self.sync_debug_mode == 2 and debug_mode_sees:
            raise RuntimeError(f"called a synchronizing CUDA operation ({kind}: {op})")
        if self.sync_debug_mode == 1 and debug_mode_sees:
            warnings.warn(f"called a synchronizing CUDA operation ({kind}: {op})", stacklevel=3)

    def syncs_on(self, thread_id: int) -> list[Sync]:
        with self._lock:
            return [s for s in self.syncs if s.thread_id == thread_id]

    # ---- one op ------------------------------------------------------------------------------

    def count_launch(self, what: str) -> int:
        """Count one launch (an op, or a factory or upload made on the device) on this thread;
        its id."""
        thread = threading.get_ident()
        with self._lock:
            self.ops_by_thread[thread] += 1
            if thread not in self.op_sites:
                self.op_sites[thread] = f"{what} at {_site()}"
        return thread

    def run_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        leaves, _ = tree_flatten((args, kwargs))
        emulated = [t for t in leaves if isinstance(t, EmulatedCudaTensor)]
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        plain = [t for t in tensors if not isinstance(t, EmulatedCudaTensor)]
        thread = self.count_launch(str(func))
        packet = func.overloadpacket
        index = self._op_device(func, args, kwargs, emulated, plain)
        kind = self._sync_kind(packet, func, args, kwargs, emulated, plain)
        if kind is not None:
            self.sync(kind, str(func))
        if self.capture is not None:
            self.capture.check_launch(self, index)
        if packet is aten.scaled_dot_product_attention:
            self.attention.append(flash_eligibility(*args, **kwargs))
        out = self._run_backing(func, args, kwargs)
        wrapped = self._wrap_outputs(func, args, out, index)
        if self.capture is not None and self.capture.thread == thread:
            self.capture.record(self, func, args, kwargs, wrapped)
        for observer in self.observers:
            observer(func, args, kwargs, wrapped)
        if packet is aten._to_copy and kind is None and index is None and emulated:
            return PendingHostTensor.of(wrapped, self)  # a non-blocking readback, under way
        return wrapped

    def _op_device(
        self, func: Any, args: tuple, kwargs: dict, emulated: list, plain: list
    ) -> int | None:
        """The CUDA device the op runs on; raises on a mix a GPU refuses."""
        target = kwargs.get("device")
        indices = {t.device.index for t in emulated}
        packet = func.overloadpacket
        if packet in _COPIES:  # copies cross devices by design
            if target is not None and torch.device(target).type == "cuda":
                return self.index_of(target)
            return (
                None
                if target is not None and torch.device(target).type == "cpu"
                else (min(indices) if indices else None)
            )
        if len(indices) > 1:
            a, b = sorted(indices)[:2]
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, cuda:{a} and cuda:{b}!"
            )
        if packet in _INDEXING and not isinstance(args[0], EmulatedCudaTensor):
            raise RuntimeError(  # cpu_tensor[cuda_index]: a GPU indexes on the indexed device
                "indices should be either on cpu or on the same device as the indexed tensor "
                f"(cpu) (op {func}, emulated)"
            )
        mixed = [t for t in plain if t.device.type == "cpu" and t.dim() > 0]
        if mixed and packet not in _INDEXING:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, cuda:{min(indices)} and cpu! (op {func}, emulated)"
            )
        if target is not None and torch.device(target).type == "cuda":
            return self.index_of(target)
        return min(indices) if indices else None

    def _sync_kind(
        self, packet: Any, func: Any, args: tuple, kwargs: dict, emulated: list, plain: list
    ) -> str | None:
        if packet in _SYNC_OPS:
            return _SYNC_OPS[packet]
        if packet is aten.repeat_interleave and kwargs.get("output_size") is None:
            return "repeat_interleave"
        if packet in _INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            given = [i for i in indices if isinstance(i, torch.Tensor)]
            if any(i.dtype in (torch.bool, torch.uint8) for i in given):
                return "boolean_index"
            if any(not isinstance(i, EmulatedCudaTensor) and i.dim() > 0 for i in given):
                return "host_to_device"
            return None
        if packet in _COPIES:
            return self._copy_kind(packet, args, kwargs)
        return None

    def _copy_kind(self, packet: Any, args: tuple, kwargs: dict) -> str | None:
        if packet is aten._to_copy:
            target = kwargs.get("device")
            source = args[0]
            to_host = target is not None and torch.device(target).type == "cpu"
            if isinstance(source, EmulatedCudaTensor):  # non-blocking: a PendingHostTensor
                return "device_to_host" if to_host and not kwargs.get("non_blocking") else None
            return self._upload_kind(source, kwargs.get("non_blocking", False))
        dest, source = args[0], args[1]
        blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if isinstance(dest, EmulatedCudaTensor) and not isinstance(source, EmulatedCudaTensor):
            if source.dim() == 0 and source.device.type == "cpu":
                return None  # a scalar travels with the kernel launch
            return self._upload_kind(source, not blocking)
        if isinstance(source, EmulatedCudaTensor) and not isinstance(dest, EmulatedCudaTensor):
            return "device_to_host"
        return None

    def _upload_kind(self, source: torch.Tensor, non_blocking: bool) -> str | None:
        if non_blocking and self.is_pinned(source):
            return None  # an asynchronous copy from page-locked memory
        return "host_to_device"

    def _run_backing(self, func: Any, args: tuple, kwargs: dict) -> Any:
        uargs, ukwargs = unwrap_all(args), unwrap_all(kwargs)
        device = ukwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            ukwargs["device"] = torch.device(self.backing)
        if self.backing == "meta":
            return self._run_meta(func, uargs, ukwargs)
        return func(*uargs, **ukwargs)

    def _run_meta(self, func: Any, uargs: Any, ukwargs: Any) -> Any:
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense:
            return 0  # no values on meta: a sync still counts, its value is a placeholder
        if packet is aten._to_copy and torch.device(ukwargs.get("device") or "meta").type == "cpu":
            source = uargs[0]
            return torch.zeros(source.shape, dtype=ukwargs.get("dtype") or source.dtype)
        to_meta = lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t  # noqa: E731
        if packet is aten.copy_ and uargs[0].device.type == "cpu":
            return uargs[0]  # a device-to-host copy of no values
        return func(*tree_map(to_meta, uargs), **tree_map(to_meta, ukwargs))

    def _wrap_outputs(self, func: Any, args: tuple, out: Any, index: int | None) -> Any:
        if index is None or func.overloadpacket is aten.copy_:
            return out  # a copy to the host: a plain tensor; copy_: its destination, already
        # a view of a tensor made outside inference mode is a normal tensor, as on a GPU (DDiT)
        normal = func.is_view and isinstance(args[0], torch.Tensor) and not args[0].is_inference()
        with torch.inference_mode(False) if normal else contextlib.nullcontext():
            return wrap_all(out, index, self.wrap)
