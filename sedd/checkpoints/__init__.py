"""Load and save models: one reader per layout, our native format, the model card.

``load_checkpoint(path)`` detects the layout (``load``) and hands it to its reader: ``native``
(our format), ``st3`` (st3 experiment directories) or ``reference`` (reference SEDD model
directories and training runs). The readers share ``loaded`` (the loaded model and the parts a
reader returns), ``io`` (safe file reading) and ``labels`` (the side files that name genes and
labels, for every layout), and import nothing else of this package.
"""

from sedd.checkpoints.card import model_card, model_card_dict
from sedd.checkpoints.io import CheckpointError, CheckpointNotFoundError
from sedd.checkpoints.load import DEFAULT_MODEL, detect_layout, load_checkpoint
from sedd.checkpoints.loaded import (
    CONFIG_FILE,
    VECTORS_FILE,
    WEIGHTS_FILE,
    Layout,
    LoadedModel,
    UnknownLabelError,
    build_model,
    read_model_config,
)
from sedd.checkpoints.native import save_native

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_MODEL",
    "VECTORS_FILE",
    "WEIGHTS_FILE",
    "CheckpointError",
    "CheckpointNotFoundError",
    "Layout",
    "LoadedModel",
    "UnknownLabelError",
    "build_model",
    "detect_layout",
    "load_checkpoint",
    "model_card",
    "model_card_dict",
    "read_model_config",
    "save_native",
]
