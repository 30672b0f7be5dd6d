"""sedd: inference for score-entropy discrete diffusion (SEDD) models of single cells.

    import sedd
    model = sedd.load()                     # the bundled PBMC model, or a path
    cells = model.generate(100, condition="CD14+ Monocyte", seed=0)   # AnnData

``load`` and ``Model`` come from ``sedd.api``; they are imported on first use, so ``import sedd``
(and the ``sedd`` command line) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sedd.api import Model, load

__version__ = "0.1.0"
__all__ = ["Model", "__version__", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "Model"):
        from sedd import api

        return getattr(api, name)
    raise AttributeError(f"module 'sedd' has no attribute {name!r}")
