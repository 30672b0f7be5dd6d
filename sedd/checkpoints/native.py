"""Our own format: ``config.json`` (``sedd.checkpoints.schema.ModelConfig``) +
``model.safetensors`` (fp32), plus ``perturbation_vectors.safetensors`` for vector-conditioned
models."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from safetensors.torch import save

from sedd.checkpoints.io import CheckpointError, read_safetensors
from sedd.checkpoints.loaded import (
    CONFIG_FILE,
    VECTORS_FILE,
    WEIGHTS_FILE,
    LoadedModel,
    SourceParts,
    read_model_config,
)
from sedd.checkpoints.schema import ModelConfig
from sedd.io.files import sha256_file, write_bytes_atomic


def load_native(root: Path, checkpoint: str | None) -> SourceParts:
    if checkpoint not in (None, WEIGHTS_FILE):
        raise CheckpointError(
            f"{root} is a native model with a single weights file ({WEIGHTS_FILE}); "
            f"leave out --checkpoint (got {checkpoint!r})."
        )
    config = read_model_config(root / CONFIG_FILE)
    weights = root / WEIGHTS_FILE
    state, _ = read_safetensors(weights)
    vectors = None
    if config.perturbation_vectors:
        vectors_file = root / VECTORS_FILE
        tensors, metadata = read_safetensors(vectors_file)
        try:
            order = json.loads(metadata.get("names", "null")) or sorted(tensors)
        except json.JSONDecodeError:
            order = None
        if not isinstance(order, list) or sorted(order) != sorted(tensors):
            raise CheckpointError(
                f"{vectors_file}: its 'names' metadata does not list its tensors; "
                "convert the model again."
            )
        vectors = {name: tensors[name].clone() for name in order}  # own memory, not the file's
    return SourceParts(config, state, weights, sha256_file(weights), vectors)


def save_native(
    loaded: LoadedModel,
    dst: str | Path,
    *,
    training_command: str | None = None,
    data_hash: str | None = None,
) -> Path:
    """Write ``loaded`` as a native model directory (fp32); returns the directory."""
    dst = Path(dst).expanduser()
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(f"{dst} exists and is not a directory; pass a directory path.")
    if dst.resolve() == loaded.path.resolve() and loaded.layout != "native":
        raise CheckpointError(f"refusing to write the native files into the source {dst}.")
    dst.mkdir(parents=True, exist_ok=True)

    provenance = loaded.config.provenance.model_copy(
        update={
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "training_command": training_command or loaded.config.provenance.training_command,
            "data_hash": data_hash or loaded.config.provenance.data_hash,
        }
    )
    config = loaded.config.model_copy(
        update={
            "provenance": provenance,
            "perturbation_vectors": loaded.perturbation_vectors is not None,
        }
    )
    # Re-validate: model_copy(update=...) skips validation.
    config = ModelConfig.model_validate(config.model_dump())

    state = {
        key: (value.float() if value.is_floating_point() else value).detach().cpu().clone()
        for key, value in loaded.model.state_dict().items()
    }
    # One metadata key only: safetensors writes metadata in hash-map order, which changes from
    # process to process, and identical weights must give an identical file (and sha256).
    # The schema version lives in config.json.
    # safetensors' save_file creates files 0600; write its bytes like any other output (0644)
    write_bytes_atomic(dst / WEIGHTS_FILE, save(state, metadata={"format": "pt"}))
    vectors_path = dst / VECTORS_FILE
    if loaded.perturbation_vectors is not None:
        names = list(loaded.perturbation_vectors)
        tensors = {n: loaded.perturbation_vectors[n].float().cpu().contiguous() for n in names}
        write_bytes_atomic(vectors_path, save(tensors, metadata={"names": json.dumps(names)}))
    elif vectors_path.exists():
        vectors_path.unlink()  # a stale file from an earlier save would contradict config.json
    write_bytes_atomic(dst / CONFIG_FILE, (config.model_dump_json(indent=2) + "\n").encode())
    return dst
