"""The precision policy (docs/precision.md), in one place.

This is the only module that enters ``torch.autocast`` or casts around a model:

* ``resolve_precision`` turns a user's request ("auto", "bf16", "fp16", "fp32") and a device into
  a ``PrecisionPolicy``, failing fast with a message that says what to use instead (rule 6).
* ``PrecisionPolicy.block_scores`` runs one fixed-shape block's forward under autocast and hands
  the sampler an fp32 tensor (rules 2 and 3), with no host sync; the sampler flags non-finite
  rows on the device and recomputes them with ``amp=False`` after its readback (rule 5).
* ``fp32_fallback`` is that recomputation (rule 5), the only one: the sampler's step and
  ``PrecisionPolicy.forward`` both run their non-finite rows again through it.
* ``PrecisionPolicy.forward`` does the same for whole batches outside the step (precision
  reports, benchmarks): rows whose output is not finite are recomputed in fp32 and returned
  with it, so whoever owns those rows counts them (no counters on the policy).
* ``fp32_region`` is the fp32 island a model uses for numerically sensitive tails (e.g. the
  ``log(expm1(sigma))`` scaling of a SEDD score network).
* ``PrecisionPolicy.record`` is what every output stores (rule 8).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, TypeVar

import numpy as np
import torch

AmpName = Literal["auto", "bf16", "fp16", "fp32", "off"]

_DTYPES: dict[str, torch.dtype | None] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": None,
    "off": None,
}
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}
T = TypeVar("T")


class PrecisionError(ValueError):
    """A precision setting the device cannot honour."""


class NonFiniteScoreError(RuntimeError):
    """The model produced NaN/Inf even in fp32: the request cannot be completed."""


class ScoreModel(Protocol):
    """What any module must provide to be sampled (the full contract: ``sedd.models.st3``)."""

    parametrisation: Literal["x0", "score"]
    vocab_size: int
    mask_index: int | None

    def __call__(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def amp_dtype_from_name(name: str) -> torch.dtype | None:
    """``"bf16" -> torch.bfloat16``; ``"fp32"``/``"off"`` -> ``None`` (autocast off)."""
    if name not in _DTYPES:
        raise PrecisionError(
            f"precision must be one of 'auto', 'bf16', 'fp16', 'fp32', 'off'; got {name!r}."
        )
    return _DTYPES[name]


def amp_name(dtype: torch.dtype | None) -> str:
    """Inverse of ``amp_dtype_from_name``: ``torch.bfloat16 -> "bf16"``, ``None -> "fp32"``."""
    if dtype == torch.float32:
        return "fp32"
    if dtype not in _NAMES:
        raise PrecisionError(f"amp_dtype must be bfloat16, float16 or None, got {dtype}.")
    return _NAMES[dtype]


def cpu_has_native_bf16() -> bool:
    """True when oneDNN has native bf16 kernels on this CPU (AVX512-BF16 or AMX).

    Without them bf16 autocast on CPU still computes correctly but is emulated, and far slower
    than fp32 (measured ~3-4x slower end to end on an AVX2-only AMD EPYC).
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _device_supports_bf16(device: torch.device, *, native: bool = False) -> bool:
    """Whether ``device`` (that device, not the current one) runs bf16; ``native``: with its
    own bf16 units (CUDA compute capability 8.0 and up: A100, H100), not emulated."""
    match device.type:
        case "cuda":
            if native:
                return torch.cuda.get_device_capability(device) >= (8, 0)
            with torch.cuda.device(device):
                return torch.cuda.is_bf16_supported()
        case "cpu":
            return True  # precision: correct everywhere; fast only with native bf16 (see above)
        case "mps":
            mps = getattr(torch.backends, "mps", None)
            return bool(
                mps is not None
                and hasattr(mps, "is_macos_or_newer")
                and mps.is_macos_or_newer(14, 0)
            )
        case _:
            return False


@dataclass(frozen=True)
class _RowInputs:
    """A forward's per-row inputs, selectable together."""

    x: torch.Tensor  # (B, L)
    sigma: torch.Tensor  # (B,)
    labels: torch.Tensor | None
    cell_types: torch.Tensor | None

    def rows(self, index: torch.Tensor | slice) -> _RowInputs:
        def take(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[index]

        labels, cell_types = take(self.labels), take(self.cell_types)
        return _RowInputs(self.x[index], self.sigma[index], labels, cell_types)


class ScoreOutput(NamedTuple):
    """What ``PrecisionPolicy.forward`` returns: the fp32 output and the rows it redid in fp32."""

    scores: torch.Tensor  # (M, V) at the selected positions, or (B, L, V); fp32
    fp32_fallback_rows: tuple[int, ...]  # batch rows recomputed in fp32 (rule 5); usually ()


@dataclass(frozen=True)
class PrecisionPolicy:
    """How model forwards run on one device. ``amp_dtype`` is ``None`` for plain fp32.

    Stateless: ``forward`` returns the rows it recomputed in fp32 instead of counting them, so
    one policy serves any number of runs and requests, each counting its own fallbacks.
    """

    device: torch.device
    amp_dtype: torch.dtype | None = torch.bfloat16
    tf32: bool = False
    weight_dtype: torch.dtype = torch.float32

    @property
    def name(self) -> str:
        return amp_name(self.amp_dtype)

    @contextlib.contextmanager
    def autocast(self, *, cache: bool = True) -> Iterator[None]:
        """Autocast for a model forward only (rule 2); a no-op for fp32. ``cache=False`` keeps
        autocast from caching the weights' casts (required while a CUDA graph is captured)."""
        if self.amp_dtype is None:
            with torch.autocast(self.device.type, enabled=False):
                yield
        else:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=cache):
                yield

    def block_scores(
        self,
        model: ScoreModel,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        *,
        amp: bool = True,
    ) -> torch.Tensor:
        """(B, L, V) fp32 output of one forward of ``model`` over the block ``x`` (B, L), under
        this policy (``amp=False``: autocast off, for the rule-5 recomputation). No host sync:
        the sampler checks finiteness on the device."""
        region = self.autocast(cache=not _capturing()) if amp else self._fp32()
        with torch.inference_mode(), region:
            raw = model(x, sigma, labels=labels, cell_types=cell_types)
        # precision: rule 3, the output leaves autocast as fp32 before any scaling.
        return raw.float()

    def _fp32(self) -> contextlib.AbstractContextManager[None]:
        return torch.autocast(self.device.type, enabled=False)

    def forward(
        self,
        model: ScoreModel,
        x: torch.Tensor,
        sigma: torch.Tensor,
        labels: torch.Tensor | None = None,
        cell_types: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        block_rows: int | None = None,
    ) -> ScoreOutput:
        """Run ``model`` under this policy; its output comes back in fp32.

        x: (B, L) tokens; sigma: (B,) total noise per row. ``positions`` (B, L) bool selects the
        positions the sampler needs; the scores are then (M, V) for the M selected positions
        (row-major), otherwise (B, L, V). ``block_rows`` runs the model on blocks of exactly that
        many rows (the last one padded with copies of its last row), so every row goes through
        the same kernel shapes whatever the batch: a row's scores are then bit-identical
        whatever else is in the batch. A row whose output holds NaN/Inf is recomputed in fp32
        (rule 5) and listed in ``fp32_fallback_rows``; if fp32 fails too,
        ``NonFiniteScoreError`` is raised.
        """
        inputs = _RowInputs(x, sigma, labels, cell_types)
        out = self._blocks(model, inputs, positions, block_rows, amp=True)
        bad = self._bad_rows(out, positions, x.shape[0]).cpu().numpy()
        if not bad.size:
            return ScoreOutput(out, ())

        def recompute(index: torch.Tensor, amp: bool) -> tuple[torch.Tensor, np.ndarray]:
            redo = self._blocks(model, inputs.rows(index), None, block_rows, amp=amp)
            return redo, (~torch.isfinite(redo).flatten(1).all(dim=1)).cpu().numpy()

        bad_rows, redo = fp32_fallback(bad, x.device, recompute)
        rows = tuple(bad.tolist())
        if positions is None:
            out[bad_rows] = redo
            return ScoreOutput(out, rows)
        full = torch.zeros(x.shape[0], *redo.shape[1:], dtype=out.dtype, device=out.device)
        full[bad_rows] = redo
        fixed = full[positions]  # (M, V), only the redone rows are non-zero
        row_of = self._row_of_position(positions)
        redone = torch.isin(row_of, bad_rows)
        out[redone] = fixed[redone]
        return ScoreOutput(out, rows)

    def _blocks(
        self,
        model: ScoreModel,
        inputs: _RowInputs,
        positions: torch.Tensor | None,
        block_rows: int | None,
        *,
        amp: bool,
    ) -> torch.Tensor:
        """The fp32 output of ``model`` over ``inputs``, in blocks of ``block_rows`` rows."""
        parts = []
        for lo, hi, index in fixed_blocks(inputs.x.shape[0], block_rows, inputs.x.device):
            block = inputs.rows(index)
            out = self.block_scores(
                model, block.x, block.sigma, block.labels, block.cell_types, amp=amp
            )[: hi - lo]  # (b, L, V)
            parts.append(out if positions is None else out[positions[lo:hi]])  # or (M, V)
        return torch.cat(parts) if len(parts) != 1 else parts[0]

    @staticmethod
    def _row_of_position(positions: torch.Tensor) -> torch.Tensor:
        return positions.nonzero()[:, 0]

    def _bad_rows(
        self, out: torch.Tensor, positions: torch.Tensor | None, batch: int
    ) -> torch.Tensor:
        finite = torch.isfinite(out).flatten(1).all(dim=1)
        if positions is None:
            return (~finite).nonzero().flatten()
        bad_positions = ~finite
        if not bad_positions.any():
            return torch.empty(0, dtype=torch.long, device=out.device)
        rows = self._row_of_position(positions)[bad_positions]
        return torch.unique(rows)

    def record(self, fp32_fallbacks: int = 0) -> dict[str, object]:
        """The precision record stored with every output (rule 8), with the output's own count
        of rows recomputed in fp32."""
        return {
            "amp_dtype": self.name,
            "weight_dtype": str(self.weight_dtype).removeprefix("torch."),
            "tf32": self.tf32,
            "device": str(self.device),
            "torch_version": str(torch.__version__),
            "fp32_fallbacks": int(fp32_fallbacks),
        }


def fp32_fallback(
    bad: np.ndarray,
    device: torch.device,
    recompute: Callable[[torch.Tensor, bool], tuple[T, np.ndarray]],
) -> tuple[torch.Tensor, T]:
    """Rule 5, the one fp32 fallback (``Sampler.settle``'s and ``PrecisionPolicy.forward``'s):
    the rows ``bad`` (host indices) whose output held NaN/Inf are run again with autocast off,
    ``recompute(index, False)``, which returns its result and, per row of ``index``, whether it
    is still not finite; any such row raises ``NonFiniteScoreError``, naming it. Returns
    ``index`` (``bad`` on ``device``) and the result, for the caller to write back."""
    index = torch.from_numpy(bad).to(device)
    # precision: rule 5, recompute only the affected rows with autocast off.
    redo, still = recompute(index, False)
    if still.any():
        raise NonFiniteScoreError(
            f"model output is not finite for rows {bad[still].tolist()} even in fp32; "
            "check the checkpoint weights and the inputs."
        )
    return index, redo


def fixed_blocks(
    total: int, block_rows: int | None, device: torch.device | str
) -> Iterator[tuple[int, int, slice | torch.Tensor]]:
    """(lo, hi, index) of each forward block over ``total`` rows: exactly ``block_rows`` rows a
    block (``None``: one block of all), the last padded with copies of its last row. ``index``
    picks the block's rows: a slice (a view) for a full block, else a padding gather."""
    size = total if block_rows is None else block_rows
    if size < 1:
        raise ValueError(f"`block_rows` must be >= 1, got {block_rows}.")
    for lo in range(0, total, size):
        hi = min(lo + size, total)
        if hi - lo == size:
            yield lo, hi, slice(lo, hi)
        else:
            yield lo, hi, torch.arange(lo, lo + size, device=device).clamp_max(hi - 1)


def _capturing() -> bool:
    """True while a CUDA graph is being captured on this thread's stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def resolve_precision(
    requested: AmpName | str, device: torch.device | str, tf32: bool = False
) -> PrecisionPolicy:
    """Apply the device rules (docs/precision.md rule 6) and return a policy.

    - CUDA: bf16 needs ``torch.cuda.is_bf16_supported()`` on the requested device; ``auto``
      picks it where the device has native bf16 (compute capability >= 8.0); fp16 is allowed.
    - CPU: bf16 is allowed (with a warning where the CPU lacks native bf16, since it is then
      slower than fp32); fp16 is refused.
    - MPS: fp16 default, bf16 only if supported.
    - ``auto``: bf16 on bf16-capable CUDA and on CPUs with native bf16 (fp16 on MPS), else fp32.
    TF32 (CUDA matmuls) is an explicit setting; it is applied here and recorded.
    """
    device = torch.device(device)
    if requested == "auto":
        if device.type == "mps":
            requested = "fp16"
        elif (device.type == "cuda" and _device_supports_bf16(device, native=True)) or (
            device.type == "cpu" and cpu_has_native_bf16()
        ):
            requested = "bf16"
        else:
            requested = "fp32"
    dtype = amp_dtype_from_name(requested)
    if dtype == torch.bfloat16 and not _device_supports_bf16(device):
        alt = "'fp16' or 'fp32'" if device.type in ("cuda", "mps") else "'fp32'"
        raise PrecisionError(
            f"precision 'bf16' is not supported on device {device}; use {alt} instead."
        )
    if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            "this CPU has no native bf16 (AVX512-BF16/AMX): bf16 autocast is emulated and slower "
            "than fp32; use precision 'fp32' (or 'auto') for speed.",
            stacklevel=2,
        )
    if dtype == torch.float16 and device.type == "cpu":
        raise PrecisionError(
            "precision 'fp16' is refused on CPU (no fast fp16 kernels, and fp16 range overflows); "
            "use 'bf16' or 'fp32' instead."
        )
    if tf32 and device.type != "cuda":
        raise PrecisionError(f"tf32=True only applies to CUDA devices, got device {device}.")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return PrecisionPolicy(device=device, amp_dtype=dtype, tf32=tf32)


@contextlib.contextmanager
def fp32_region(device_type: str) -> Iterator[None]:
    """An fp32 island inside a model forward: autocast off for the enclosed ops.

    Inputs must be cast with ``.float()`` by the caller; ops inside then run in fp32 even when
    the surrounding forward runs under bf16/fp16 autocast.
    """
    with torch.autocast(device_type, enabled=False):
        yield
