"""Streams, events and CUDA graphs, emulated.

A stream is current per thread and device (``torch.cuda.stream`` sets it); there is no
concurrency, so waits are no-ops. A graph records the aten ops its capturing thread launches
between ``capture_begin`` and ``capture_end`` and replays them on the very same tensors, as CUDA
does with device pointers. What a real capture refuses raises here too:

* an op launched while capturing on a stream other than the capturing one (e.g. a kernel for
  ``cuda:1`` while ``cuda:0``'s stream captures: a graph that would replay nothing for it);
* a host sync during capture (``Emulator.sync``);
* replay on another device than the capture's.

A replay that would read memory freed since the capture (a tensor made outside the capture, e.g.
a cached table or a weight, whose last reference has gone: on a GPU its memory may be reused, and
the replay silently reads whatever is there) raises ``FreedGraphInputError`` naming the op.
Tensors made during the capture belong to the graph's pool and live as long as the graph.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from sedd.cuda_emulation.runtime import EmulatedCudaError, Emulator
from sedd.cuda_emulation.tensor import EmulatedCudaTensor, unwrap_all


class FreedGraphInputError(EmulatedCudaError):
    """A replayed graph reads memory freed after its capture (garbage on a real GPU)."""


class Stream:
    """``torch.cuda.Stream`` on the emulator: a name and a device."""

    def __init__(self, emulator: Emulator, device: Any = None, priority: int = 0) -> None:
        self.emulator = emulator
        self.device_index = emulator.index_of(device)
        self.priority = priority

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def wait_stream(self, other: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event(self.emulator)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.emulator.sync("synchronize", "Stream.synchronize")

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<emulated torch.cuda.Stream device={self.device} id={id(self):#x}>"


class Event:
    """``torch.cuda.Event``: records the host time (there is no device time to read)."""

    def __init__(self, emulator: Emulator, enable_timing: bool = False, **_: Any) -> None:
        self.emulator, self.enable_timing = emulator, enable_timing
        self.at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.at = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.emulator.sync("synchronize", "Event.synchronize", debug_mode_sees=False)

    def elapsed_time(self, end: Event) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1000.0


class Streams:
    """The current stream of each (thread, device), and each device's default stream."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.defaults = [Stream(emulator, i) for i in range(len(emulator.devices))]
        self._tls = threading.local()

    def current(self, device: Any = None) -> Stream:
        index = self.emulator.index_of(device)
        chosen: dict[int, Stream] = getattr(self._tls, "streams", {})
        return chosen.get(index, self.defaults[index])

    def set(self, stream: Stream) -> None:
        if not hasattr(self._tls, "streams"):
            self._tls.streams = {}
        self._tls.streams[stream.device_index] = stream


class StreamContext:
    """``torch.cuda.stream(s)``: ``s`` is current (and its device) inside the block."""

    def __init__(self, streams: Streams, stream: Stream | None) -> None:
        self.streams, self.stream = streams, stream
        self._saved: tuple[int, Stream, Stream] | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is None:
            return None
        emulator = self.streams.emulator
        device = emulator.current_device()
        target = self.stream.device_index
        self._saved = (device, self.streams.current(device), self.streams.current(target))
        emulator.set_device(target)
        self.streams.set(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        device, on_device, on_target = self._saved
        self.streams.set(on_target)
        self.streams.set(on_device)
        self.streams.emulator.set_device(device)


@dataclass
class _Op:
    func: Any
    args: Any  # backing tensors (kept alive: a freed input is detected by its storage id)
    kwargs: Any
    outputs: list[torch.Tensor]  # fresh outputs' backings, written again on replay
    reads: list[tuple[tuple[int, int], str]]  # outside storages read, with a description
    fresh: list[bool]  # per result, whether it is a new tensor (not a view or the input)


@dataclass
class CUDAGraph:
    """``torch.cuda.CUDAGraph`` on the emulator (see the module docstring)."""

    emulator: Emulator
    streams: Streams
    ops: list[_Op] = field(default_factory=list)
    pool_storages: set[tuple[int, int]] = field(default_factory=set)  # made while capturing
    device: int = 0
    stream: Stream | None = None
    thread: int | None = None
    mode: str = "global"
    captured: bool = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        emulator = self.emulator
        if emulator.capture is not None:
            raise EmulatedCudaError("CUDA error: a capture is already under way")
        self.device = emulator.current_device()
        self.stream = self.streams.current(self.device)
        if self.stream is self.streams.defaults[self.device]:
            raise EmulatedCudaError(
                "CUDA graphs must be captured on a non-default stream "
                "(call capture_begin inside a torch.cuda.stream() context)"
            )
        self.thread, self.mode = threading.get_ident(), capture_error_mode
        self.ops.clear()
        emulator.capture = self

    def capture_end(self) -> None:
        if self.emulator.capture is self:
            self.emulator.capture = None
        self.captured = True

    def check_launch(self, emulator: Emulator, index: int | None) -> None:
        """Raise for an op the capturing thread launches on a stream that is not capturing."""
        if index is None or threading.get_ident() != self.thread:
            return
        if self.streams.current(index) is not self.stream:
            raise EmulatedCudaError(
                f"CUDA error: operation not permitted when stream is capturing (a kernel for "
                f"cuda:{index} was launched on a stream that is not capturing, while "
                f"cuda:{self.device}'s stream captures)"
            )

    def record(self, emulator: Emulator, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        reads: list[tuple[tuple[int, int], str]] = []
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, EmulatedCudaTensor):
                ident = emulator.storage_id(leaf)
                if ident not in self.pool_storages:
                    shape = "x".join(map(str, leaf.shape)) or "scalar"
                    reads.append((ident, f"a {shape} {leaf.dtype} tensor"))
        # Fresh outputs are those that share no memory with an input. The schema is not enough:
        # ``aten.to.dtype`` is declared as an alias of its input, yet a cast makes a new tensor.
        inputs = {
            leaf.backing.untyped_storage()._cdata
            for leaf in tree_flatten((args, kwargs))[0]
            if isinstance(leaf, EmulatedCudaTensor)
        }
        outs = out if isinstance(out, tuple | list) else (out,)
        flags = [
            isinstance(value, EmulatedCudaTensor)
            and value.backing.untyped_storage()._cdata not in inputs
            for value in outs
        ]
        fresh = [value.backing for value, new in zip(outs, flags, strict=True) if new]
        self.ops.append(_Op(func, unwrap_all(args), unwrap_all(kwargs), fresh, reads, flags))

    def record_call(self, make: Any, result: Any) -> None:
        """Record a factory call made during the capture (``torch.zeros(..., device=...)``)."""
        outs = [t.backing for t in tree_flatten(result)[0] if isinstance(t, EmulatedCudaTensor)]
        self.ops.append(_Op(make, (), {}, outs, [], [True] * len(outs)))

    def replay(self) -> None:
        if not self.captured:
            raise EmulatedCudaError("CUDA error: replay of a graph that was never captured")
        emulator = self.emulator
        if emulator.current_device() != self.device:
            raise EmulatedCudaError(
                f"CUDA error: a graph captured on cuda:{self.device} was replayed with "
                f"cuda:{emulator.current_device()} current (wrap the replay in "
                f"torch.cuda.device(cuda:{self.device}))"
            )
        with torch.inference_mode():  # device memory has no autograd state
            self._replay()

    def _replay(self) -> None:
        emulator = self.emulator
        for op in self.ops:
            for ident, what in op.reads:
                if not emulator.storage_alive(ident):
                    raise FreedGraphInputError(
                        f"a replayed CUDA graph reads {what} in {op.func} that was freed after "
                        "the capture: on a GPU it reads reused memory (keep the captured "
                        "graph's inputs alive)"
                    )
            result = op.func(*op.args, **op.kwargs)
            results = result if isinstance(result, tuple | list) else (result,)
            if op.func is not None and not hasattr(op.func, "_schema"):  # a recorded call
                results = tuple(t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor))
            fresh = [r for r, new in zip(results, op.fresh, strict=False)
                     if isinstance(r, torch.Tensor) and new]  # fmt: skip
            for static, value in zip(op.outputs, fresh, strict=False):
                static.copy_(value)

    def reset(self) -> None:
        self.ops.clear()
        self.pool_storages.clear()
        self.captured = False

    def pool(self) -> tuple[int, int]:
        return (0, id(self))


class GraphContext:
    """``torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global")``.

    Without ``stream`` it captures on one side stream made at first use on the then-current
    device and kept for every later capture, as torch does (``graph.default_capture_stream``).
    """

    default_capture_stream: Stream | None = None

    def __init__(
        self,
        graph: CUDAGraph,
        pool: Any = None,
        stream: Stream | None = None,
        capture_error_mode: str = "global",
    ) -> None:
        if stream is None:
            if GraphContext.default_capture_stream is None:
                GraphContext.default_capture_stream = Stream(graph.emulator)
            stream = GraphContext.default_capture_stream
        self.graph, self.mode = graph, capture_error_mode
        self.context = StreamContext(graph.streams, stream)

    def __enter__(self) -> None:
        self.graph.emulator.sync("capture", "torch.cuda.graph (synchronize before capture)")
        self.context.__enter__()
        self.graph.capture_begin(capture_error_mode=self.mode)

    def __exit__(self, *exc: object) -> None:
        try:
            self.graph.capture_end()
        finally:
            self.context.__exit__(*exc)
