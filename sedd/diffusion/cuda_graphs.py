"""CUDA graphs for the sampler's fixed-shape block steps (vLLM's and SGLang's trick, at our scale).

A block step (``Sampler._block_step``: forward, transition, fp64 draw) runs on exactly
``block_rows`` rows and never reads a value back, so on CUDA it can be captured once per shape
and replayed: the host then launches one graph per block instead of a few hundred kernels. A
graph is captured per key: the rows' shapes and dtypes (block rows, kind of conditioning,
imputation or not), the ``StepBranches`` and whether autocast is on. Replay copies the inputs into
the graph's static tensors and clones its outputs (the next replay overwrites them). Graphs share
one memory pool, as their replays never overlap.

Off unless asked for (``Sampler(cuda_graphs=True)``; the engine's ``cuda_graphs`` setting, the
CLI's ``--cuda-graphs``, ``SEDD_CUDA_GRAPHS``), and always eager off CUDA. A capture that fails
warns once and the sampler stays eager from then on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from sedd.diffusion.step_rows import StepBranches, StepRows

log = logging.getLogger(__name__)

# (tokens, nonfinite, active, expected counts: None unless the rows carry them)
BlockResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]
BlockStep = Callable[[StepRows, StepBranches, bool], BlockResult]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def cuda_graphs_from_env(default: bool = False) -> bool:
    """``SEDD_CUDA_GRAPHS`` as a bool (unset: ``default``); a value that is neither raises."""
    raw = os.environ.get("SEDD_CUDA_GRAPHS")
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(
            f"`SEDD_CUDA_GRAPHS` must be 1/0, true/false, yes/no or on/off, got {raw!r}."
        )
    return value in _TRUE


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: list[torch.Tensor | None]  # static tensors the replay reads
    outputs: BlockResult  # static tensors the replay writes


class GraphedSteps:
    """Runs ``step`` eagerly, or from a captured CUDA graph per shape (see the module docstring)."""

    def __init__(self, step: BlockStep, *, enabled: bool, device: torch.device) -> None:
        self.step = step
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.captures = 0  # graphs captured
        self.replays = 0  # block steps served by a replay
        self._graphs: dict[tuple[object, ...], _Captured] = {}
        self._pool: Any = None

    @staticmethod
    def key(
        values: Sequence[torch.Tensor | None], branches: StepBranches, amp: bool
    ) -> tuple[object, ...]:
        """What a captured graph is kept under: every input that changes what the step computes
        (each branch flag, autocast, each row tensor's shape and dtype). A flag left out would
        replay one branch's capture for rows of another (tests/engine/test_lane_catches.py)."""
        return (branches, amp, *(None if v is None else (tuple(v.shape), v.dtype) for v in values))

    def run(self, rows: StepRows, branches: StepBranches, amp: bool) -> BlockResult:
        if not self.enabled:
            return self.step(rows, branches, amp)
        values = rows.tensors()
        key = self.key(values, branches, amp)
        captured = self._graphs.get(key)
        if captured is None:
            try:
                captured = self._capture(rows, branches, amp)
            except Exception as err:  # e.g. an op that cannot be captured: stay eager
                self.enabled = False
                warnings.warn(
                    f"CUDA graph capture failed ({type(err).__name__}: {err}); sampling "
                    "continues eagerly. Pass --no-cuda-graphs (SEDD_CUDA_GRAPHS=0) to skip "
                    "the attempt.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                log.warning("CUDA graph capture failed; eager from now on", exc_info=True)
                return self.step(rows, branches, amp)
            self._graphs[key] = captured
        for static, value in zip(captured.inputs, values, strict=True):
            if static is not None and value is not None:
                static.copy_(value)
        with self._current():  # replay on this device's stream, not device 0's
            captured.graph.replay()
        self.replays += 1
        tokens, nonfinite, active, expected = captured.outputs
        kept = None if expected is None else expected.clone()
        return tokens.clone(), nonfinite.clone(), active.clone(), kept

    def _current(self) -> contextlib.AbstractContextManager[object]:
        """This device as the current CUDA device (a no-op off CUDA, where graphs are stand-ins
        in tests)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext()

    def _capture(self, rows: StepRows, branches: StepBranches, amp: bool) -> _Captured:
        inputs = [None if v is None else v.clone() for v in rows.tensors()]
        static = StepRows.from_tensors(inputs)
        # Warm up on a side stream first (lazy initialisation, cuBLAS workspaces), as
        # torch.cuda.graphs recommends, then capture on it. Everything happens with our device
        # current and on a stream of it: torch.cuda.graph's own default capture stream belongs
        # to whichever device was current when it was first made (cuda:0 for --device cuda:1).
        with self._current():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.step(static, branches, amp)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=side):
                outputs = self.step(static, branches, amp)
        self._pool = graph.pool()
        self.captures += 1
        return _Captured(graph, inputs, outputs)
