"""What each op on emulated CUDA would cost a GPU: FLOPs and bytes moved, counted per region.

``OpCounter`` is an ``Emulator`` observer (``sedd.cuda_emulation.runtime``): every aten op on an
emulated tensor adds its FLOPs and bytes to the region the caller has set (``counter.region``),
split by kind ("attention", "gemm", "other"). On the ``meta`` backing this needs no values, so
the real K562 shape is counted in seconds (``sedd.bench.roofline`` runs one block step).

FLOPs: GEMMs and attention from ``torch.utils.flop_counter``'s formulas (2·M·N·K; 4·B·h·L·S·d
for attention's two products); every other op counts none (its cost is its bytes).

Bytes, the traffic of one unfused kernel per op:

* an op reads its tensor inputs and writes its fresh outputs; an in-place or ``out=`` op writes
  its destination without reading it where the op only stores (``copy_``, ``fill_``, ...);
* a view, an allocation (``empty``) or an op that hands back its input unchanged (dropout in
  eval) moves nothing;
* a gather reads what it picks, not its whole source (embedding rows, ``index_select``);
  ``searchsorted`` reads one 32-byte sector per step of its binary search;
* copies an op makes inside its kernel are added: softmax of a strided input and a reduction
  or scan whose dtype differs from its input's both copy the input first (as ATen does).

Attention is counted as flash attention runs it, whatever kernel the backing took (on ``meta``
a decomposition may materialise L×L): each ``F.scaled_dot_product_attention`` call is one op
reading q, k, v (and a mask) and writing its output; the ops inside the call are folded into it.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

aten = torch.ops.aten

KINDS = ("attention", "gemm", "other")
SECTOR = 32  # bytes a GPU reads at least for a scattered load (one L2 sector)

_ATTENTION = {
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
}
_ALLOCATIONS = {aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided}
# ops that store into their first argument without reading it
_STORES = {aten.copy_, aten.fill_, aten.zero_, aten.uniform_, aten.normal_, aten.random_}
_GATHERS = {aten.embedding, aten.index_select, aten.gather, aten.index}
_SOFTMAX = {aten._softmax, aten._log_softmax, aten.softmax, aten.log_softmax}
_SCANS = {aten.cumsum, aten.cumprod, aten.cumsum_}
_REDUCTIONS = {aten.sum, aten.mean, aten.prod}
_LOW = (torch.float16, torch.bfloat16)


@dataclass
class Cost:
    """FLOPs and bytes of a set of ops (``ops``: how many, ``folded``: counted into another)."""

    flops: float = 0.0
    bytes: float = 0.0
    ops: int = 0
    folded: int = 0

    def add(self, flops: float, moved: float) -> None:
        self.flops += flops
        self.bytes += moved
        self.ops += 1


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements (of its backing, for an emulated tensor)."""
    backing = getattr(t, "backing", t)
    return backing.numel() * backing.element_size()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def gemm_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> float | None:
    """FLOPs of a GEMM from ``torch.utils.flop_counter``'s registry; None for other ops.
    ``linear`` and ``matmul`` (composites the registry leaves to their parts) as ``mm``/``bmm``."""
    packet = func.overloadpacket
    if packet is aten.linear:
        x, weight = args[0], args[1]
        rows = math.prod(x.shape[:-1])
        return float(flop_registry[aten.mm]((rows, x.shape[-1]), tuple(weight.shape[::-1])))
    if packet is aten.matmul:
        a, b = args[0], args[1]
        if a.dim() < 2 or b.dim() < 2:  # a matrix-vector product: 2 FLOPs per multiply-add
            return 2.0 * max(a.numel(), b.numel())
        batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        return float(flop_registry[aten.bmm]((batch, *a.shape[-2:]), (batch, *b.shape[-2:])))
    if packet in flop_registry and packet not in _ATTENTION:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    return None


def attention_cost(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> Cost:
    """One flash-attention call: 4·B·h·L·S·d FLOPs; reads q, k, v (and a mask), writes q-sized."""
    shapes = [tuple(t.shape) for t in (q, k, v)]
    moved = sum(nbytes(t) for t in (q, k, v)) + nbytes(q)
    if isinstance(mask, torch.Tensor):
        moved += nbytes(mask)
    return Cost(float(sdpa_flop_count(*shapes)), float(moved), 1)


def _storage(t: torch.Tensor) -> int:
    return getattr(t, "backing", t).untyped_storage()._cdata


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """Bytes one op moves as one unfused GPU kernel (the rules in the module docstring)."""
    packet = func.overloadpacket
    if packet in _ALLOCATIONS:
        return 0.0
    outs = _tensors(out)
    given = {k: v for k, v in kwargs.items() if k != "out"}  # an out= tensor is stored into
    ins = _tensors((args, given))
    stores = any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns)
    storages = {_storage(t) for t in ins}
    if outs and not stores and all(_storage(o) in storages for o in outs):
        return 0.0  # a view, or an input handed back (dropout in eval, a cast to its own dtype)
    if packet in _STORES and ins:
        ins = ins[1:]
    written = float(sum(nbytes(o) for o in outs))
    if packet is aten.index_put_:  # reads the indices and values, stores the values
        return sum(nbytes(t) for t in ins[1:]) + nbytes(args[2])
    if packet is aten.index_fill_:  # stores the picked slices of its dim, reads the index
        x, dim, index = args[0], args[1], args[2]
        return nbytes(index) + x.numel() // max(x.shape[dim], 1) * index.numel() * x.itemsize
    if packet in _GATHERS:
        indices = sum(nbytes(t) for t in ins[1:] if not t.is_floating_point())
        return indices + 2.0 * written
    if packet is aten.searchsorted:
        sorted_seq, values = args[0], args[1]
        probes = math.ceil(math.log2(sorted_seq.shape[-1] + 1))
        return nbytes(values) + values.numel() * probes * SECTOR + written
    return sum(nbytes(t) for t in ins) + written + _hidden_copies(func, args, kwargs, outs)


def _hidden_copies(func: Any, args: tuple, kwargs: dict, outs: list) -> float:
    """Bytes of the copies ATen makes inside an op before its kernel runs."""
    packet, x = func.overloadpacket, args[0] if args else None
    if not isinstance(x, torch.Tensor) or not outs:
        return 0.0
    if packet in _SOFTMAX and not x.is_contiguous():  # softmax kernels take contiguous rows
        return 2.0 * nbytes(x)
    # a scan or reduction into another dtype casts its input first (ATen's impl_func_cum_ops,
    # make_reduction; only half -> float reductions read in place): the cast writes the input
    # in the output's dtype and the kernel reads that instead of the input
    dtype = outs[0].dtype
    widened = x.dtype in _LOW and dtype.is_floating_point
    if dtype != x.dtype and (packet in _SCANS or (packet in _REDUCTIONS and not widened)):
        return 2.0 * x.numel() * dtype.itemsize
    return 0.0


class _AttentionRegions(TorchFunctionMode):
    """Marks each ``F.scaled_dot_product_attention`` call, so its ops count as one flash op."""

    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.counter.depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.counter.depth -= 1
        q, k, v = args[:3]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        cost = attention_cost(q, k, v, mask)
        self.counter.costs[(self.counter.region, "attention")].add(cost.flops, cost.bytes)
        return out


class OpCounter:
    """FLOPs and bytes of every op on emulated tensors, by (region, kind).

    Set ``region`` to say where ops come from (e.g. "model" around a forward); ``costs`` maps
    (region, kind) to a ``Cost``. Use ``counting(emulator)`` around the work.
    """

    def __init__(self, region: str = "other") -> None:
        self.region = region
        self.depth = 0  # inside an attention call: ops fold into it
        self.costs: defaultdict[tuple[str, str], Cost] = defaultdict(Cost)

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self.depth:
            self.costs[(self.region, "attention")].folded += 1
            return
        if func.overloadpacket in _ATTENTION:  # an attention op outside F's: as flash still
            cost = attention_cost(*args[:3], kwargs.get("attn_mask"))
            self.costs[(self.region, "attention")].add(cost.flops, cost.bytes)
            return
        flops = gemm_flops(func, args, kwargs, out)
        kind = "other" if flops is None else "gemm"
        self.costs[(self.region, kind)].add(flops or 0.0, op_bytes(func, args, kwargs, out))

    @contextlib.contextmanager
    def counting(self, emulator: Any) -> Iterator[OpCounter]:
        """Observe ``emulator``'s ops (and mark attention calls) inside the block."""
        emulator.observers.append(self)
        try:
            with _AttentionRegions(self):
                yield self
        finally:
            emulator.observers.remove(self)
