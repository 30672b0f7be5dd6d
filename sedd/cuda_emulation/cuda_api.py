"""``torch.cuda``'s Python API on the emulator: what the project and torch itself call.

``patched(emulator)`` replaces, for the emulation's lifetime, the ``torch.cuda`` functions a CPU
build cannot answer (availability, devices, bf16 support, streams, events, graphs, memory stats,
synchronize, the sync debug mode) with answers from the emulator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from sedd.cuda_emulation.graphs import (
    CUDAGraph,
    Event,
    GraphContext,
    Stream,
    StreamContext,
    Streams,
)
from sedd.cuda_emulation.runtime import Emulator


@dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` reports."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int


class DeviceContext:
    """``torch.cuda.device(d)``: ``d`` is the current device inside the block."""

    def __init__(self, emulator: Emulator, device: Any) -> None:
        self.emulator = emulator
        self.index = -1 if device is None or device == -1 else emulator.index_of(device)
        self._saved = 0

    def __enter__(self) -> None:
        self._saved = self.emulator.current_device()
        if self.index >= 0:
            self.emulator.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        self.emulator.set_device(self._saved)


_SYNC_MODES = {"default": 0, "warn": 1, "error": 2, 0: 0, 1: 1, 2: 2}


def _api(emulator: Emulator, streams: Streams) -> dict[str, Any]:
    """name -> replacement, for every patched ``torch.cuda`` attribute."""
    spec = lambda d=None: emulator.devices[emulator.index_of(d)]  # noqa: E731

    def set_sync_debug_mode(mode: int | str) -> None:
        if mode not in _SYNC_MODES:
            raise RuntimeError(f"invalid value of debug_mode, expected one of 0,1,2, got {mode}")
        emulator.sync_debug_mode = _SYNC_MODES[mode]

    def synchronize(device: Any = None) -> None:
        # cudaDeviceSynchronize: a host sync that CUDA's sync debug mode does not report
        # (c10::cuda::device_synchronize never calls warn_or_error_on_sync)
        emulator.sync("synchronize", "torch.cuda.synchronize", debug_mode_sees=False)

    def memory_stats(device: Any = None) -> dict[str, int]:
        index = emulator.index_of(device)
        return {
            "allocated_bytes.all.current": emulator.allocated[index],
            "allocated_bytes.all.peak": emulator.peak[index],
            "reserved_bytes.all.current": emulator.allocated[index],
            "reserved_bytes.all.peak": emulator.peak[index],
        }

    def reset_peak(device: Any = None) -> None:
        index = emulator.index_of(device)
        emulator.peak[index] = emulator.allocated[index]

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        index = emulator.index_of(device)
        total = emulator.devices[index].total_memory
        return total - emulator.allocated[index], total

    def properties(device: Any = None) -> DeviceProperties:
        s = spec(device)
        return DeviceProperties(s.name, *s.capability, s.total_memory, s.multi_processor_count)

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return spec().capability >= (8, 0)

    def capturing() -> bool:
        capture = emulator.capture
        return capture is not None and streams.current(capture.device) is capture.stream

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "_lazy_init": lambda: None,
        "device_count": lambda: len(emulator.devices),
        "current_device": emulator.current_device,
        "set_device": lambda d: emulator.set_device(emulator.index_of(d)),
        "device": lambda d: DeviceContext(emulator, d),
        "get_device_name": lambda d=None: spec(d).name,
        "get_device_capability": lambda d=None: spec(d).capability,
        "get_device_properties": properties,
        "is_bf16_supported": is_bf16_supported,
        "synchronize": synchronize,
        "set_sync_debug_mode": set_sync_debug_mode,
        "get_sync_debug_mode": lambda: emulator.sync_debug_mode,
        "empty_cache": lambda: None,
        "memory_allocated": lambda d=None: emulator.allocated[emulator.index_of(d)],
        "max_memory_allocated": lambda d=None: emulator.peak[emulator.index_of(d)],
        "memory_reserved": lambda d=None: emulator.allocated[emulator.index_of(d)],
        "max_memory_reserved": lambda d=None: emulator.peak[emulator.index_of(d)],
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "memory_stats": memory_stats,
        "mem_get_info": mem_get_info,
        "Stream": lambda device=None, priority=0, **_: Stream(emulator, device, priority),
        "current_stream": streams.current,
        "default_stream": lambda d=None: streams.defaults[emulator.index_of(d)],
        "set_stream": streams.set,
        "stream": lambda s: StreamContext(streams, s),
        "Event": lambda enable_timing=False, **kw: Event(emulator, enable_timing, **kw),
        "CUDAGraph": lambda keep_graph=False: CUDAGraph(emulator, streams),
        "graph": GraphContext,
        "graph_pool_handle": lambda: (0, 0),
        "is_current_stream_capturing": capturing,
    }


@contextlib.contextmanager
def patched(emulator: Emulator) -> Iterator[Streams]:
    """``torch.cuda`` answering from ``emulator`` inside the block; the streams it uses."""
    streams = Streams(emulator)
    GraphContext.default_capture_stream = None
    with contextlib.ExitStack() as stack:
        for name, value in _api(emulator, streams).items():
            stack.enter_context(mock.patch.object(torch.cuda, name, value, create=True))
        stack.enter_context(
            mock.patch.object(torch.cuda.graphs, "is_current_stream_capturing",
                              _api(emulator, streams)["is_current_stream_capturing"])
        )  # fmt: skip
        yield streams
    GraphContext.default_capture_stream = None
