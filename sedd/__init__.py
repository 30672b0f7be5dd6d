"""sedd: inference for score-entropy discrete diffusion (SEDD) models of single cells.

    import sedd
    model = sedd.load()                     # the bundled PBMC model, or a path
    cells = model.generate(100, condition="CD14+ Monocyte", seed=0)   # AnnData

``load``, ``Model`` and ``SamplingOptions`` come from ``sedd.api`` and ``sedd.defaults``;
they are imported on first use, so ``import sedd`` (and the ``sedd`` command line) stays fast.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from sedd.api import Model, load
    from sedd.defaults import SamplingOptions

__version__ = "0.1.0"
__all__ = ["Model", "SamplingOptions", "__version__", "load"]
_LAZY = {"load": "sedd.api", "Model": "sedd.api", "SamplingOptions": "sedd.defaults"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sedd' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What ``dir(sedd)`` and tab completion show: the API, not the module's machinery."""
    return sorted(__all__)
