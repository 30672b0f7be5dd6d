"""Safe file reading for checkpoints: nothing here unpickles code.

``.pt`` files go through ``torch.load(weights_only=True)``, which refuses any object that is not
a tensor or a plain container; a file that would build objects is reported as refused (not as
corrupt) after disassembling, never executing, its pickle. safetensors holds no code.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """A checkpoint could not be loaded or saved; the message names the file and the fix."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint file or directory does not exist."""


def require_file(path: Path, what: str = "file") -> Path:
    if not path.is_file():
        raise CheckpointNotFoundError(
            f"{what} {path} does not exist"
            + (" (it is a directory)" if path.is_dir() else "")
            + "; check the path."
        )
    return path


def _corrupt(path: Path, err: Exception, detail: str | None = None) -> CheckpointError:
    detail = detail or (str(err).strip().splitlines() or [""])[0][:200]
    return CheckpointError(
        f"{path} is truncated or corrupt ({type(err).__name__}: {detail}); copy it again from "
        "its source, or pick another checkpoint file."
    )


def read_torch_file(path: Path) -> Any:
    """``torch.load(weights_only=True)`` on CPU; refuses pickled code instead of running it."""
    require_file(path)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(
            r"WeightsUnpickler error:\s*(.*?)(?: was not an allowed|\n\n|$)", str(err)
        )
        reason = found.group(1).strip() if found else ""
        if "Weights only load failed" not in str(err) or not _builds_objects(path):
            raise _corrupt(path, err, reason or None) from None
        reason = f" ({reason})" if reason else ""
        raise CheckpointError(
            f"refused to load {path}: it holds pickled Python objects other than tensors"
            f"{reason}, and unpickling them could run code. If you trust the file, load it in "
            "your own code and re-save only the state dict (torch.save(model.state_dict(), ...)) "
            "or safetensors; otherwise it may be tampered with."
        ) from None
    except Exception as err:  # torch raises many types on damaged archives
        raise _corrupt(path, err) from err


_OBJECT_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX"}


def _builds_objects(path: Path, limit: int = 1 << 24) -> bool:
    """Whether the file's pickles parse and import or call something (vs. random bytes).

    Only disassembles (``pickletools.genops``) the first ``limit`` bytes; nothing is executed.
    """
    found = False
    try:
        with path.open("rb") as f:
            if zipfile.is_zipfile(f):
                with zipfile.ZipFile(f) as archive:
                    names = [n for n in archive.namelist() if n.endswith("data.pkl")]
                    data = archive.read(names[0])[:limit] if names else b""
            else:
                f.seek(0)  # is_zipfile moved the position
                data = f.read(limit)
        stream = io.BytesIO(data)
        while stream.tell() < len(data):  # legacy torch files hold several pickles in a row
            ops = {op.name for op, _, _ in pickletools.genops(stream)}
            found = found or bool(_OBJECT_OPCODES & ops)
    except Exception:  # genops / zipfile raise many types on bytes that are no pickle
        pass
    return found


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and string metadata of a safetensors file, on CPU."""
    require_file(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            return {key: f.get_tensor(key) for key in f.keys()}, metadata  # noqa: SIM118
    except Exception as err:  # safetensors raises SafetensorError / OSError on bad files
        raise _corrupt(path, err) from err


def read_json(path: Path) -> Any:
    require_file(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); fix or replace it.") from None
    except RecursionError:
        raise CheckpointError(
            f"{path} is nested too deeply to be a config; fix or replace it."
        ) from None


def strip_wrapper_prefixes(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop a ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) prefix shared by every key."""
    state = dict(state)
    for prefix in ("module.", "_orig_mod."):
        if state and all(key.startswith(prefix) for key in state):
            state = {key.removeprefix(prefix): value for key, value in state.items()}
    return state
