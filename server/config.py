"""Service settings: pydantic-settings read from ``SEDD_*`` environment variables.

Nothing here is built at import time: ``Settings()`` is created by ``sedd serve`` (command-line
flags override the environment) or by whoever calls ``server.app.create_app``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sedd.defaults import DEFAULT_MODEL, default_device

__all__ = ["HARD_MAX_CELLS", "HARD_MAX_GENES", "HARD_MAX_STEPS", "Settings"]

# Hard ceilings, defined here once: no setting may raise a limit above them, and the request
# bodies' static bounds (``server.schemas``) are these same numbers.
HARD_MAX_CELLS = 100_000
HARD_MAX_STEPS = 100_000
HARD_MAX_GENES = 100_000


class Settings(BaseSettings):
    """Everything the service reads at start-up. Each field is ``SEDD_<NAME>`` in the environment
    (e.g. ``SEDD_MAX_STEPS=100``, ``SEDD_API_KEY=...``)."""

    model_config = SettingsConfigDict(env_prefix="SEDD_", extra="ignore")

    model: Path = Field(
        default=DEFAULT_MODEL, description="checkpoint to serve (any layout load_checkpoint reads)"
    )
    models: Path | None = Field(
        default=None,
        description="a directory of checkpoints to serve together, one folder (or file) per "
        'model, each under its name as its id; requests pick one by "model" (default: '
        "default_model); --model is then not served",
    )
    model_map: dict[str, Path] | None = Field(
        default=None,
        description="models named one by one, {id: path} (sedd serve --model ID=PATH, repeated; "
        "env: JSON), served as --models serves a directory's, beside it if both are given",
    )
    default_model: str | None = Field(
        default=None,
        description='with models: the id a body without "model" gets (default: the first id '
        "in sorted order); it stays loaded",
    )
    max_loaded_models: int = Field(
        default=3,
        ge=1,
        description="with models: most models loaded at once; the least recently used idle one "
        "is unloaded to load another",
    )
    model_admin: bool = Field(
        default=False,
        description="with models: enable POST /v1/models/{id}/load and /unload (behind the "
        "API key)",
    )
    # The side files `sedd generate` takes (``--genes`` ...), made absolute at start-up so that
    # replicas started elsewhere (Ray workers, another working directory) read the same files.
    genes: Path | None = Field(
        default=None,
        description="gene names in model order: text (one a line), JSON, or an h5ad whose "
        "var_names are used",
    )
    perturbation_map: Path | None = Field(
        default=None,
        description="perturbation label names in index order: JSON {name: index}, text (line "
        "i = index i) or st3's .pt",
    )
    vectors: Path | None = Field(
        default=None, description="perturbation vectors {name: tensor} (.pt or safetensors)"
    )
    device: str = Field(default="auto", description="'auto' (cuda if available), 'cpu', 'cuda:0'")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        default="auto", description="autocast dtype of the model forward (docs/precision.md)"
    )
    max_cells_per_request: int = Field(
        default=256, ge=1, le=HARD_MAX_CELLS, description="most cells one request may ask for"
    )
    max_steps: int = Field(
        default=1000,
        ge=1,
        le=HARD_MAX_STEPS,
        description="most reverse steps one request may ask for",
    )
    max_body_bytes: int = Field(
        default=4 * 2**20, ge=1024, description="largest request body (413 above it)"
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body must arrive within this many seconds"
    )
    max_queued_jobs: int = Field(
        default=64, ge=1, description="requests waiting to start (429 above it)"
    )
    max_rows_per_forward: int = Field(
        default=256, ge=1, description="cells the engine steps together, over all requests"
    )
    max_rows_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="cells of the requests running at once, which share each step's rows "
        "fairly; unset: 4 x max_rows_per_forward",
    )
    max_cell_steps: int | None = Field(
        default=None,
        ge=1,
        description="most cells x steps one request may ask for (422 too_costly above it); "
        "unset: what its deadline allows at the measured forward time",
    )
    forward_cost_s: float | None = Field(
        default=None,
        gt=0,
        description="price admission and Retry-After at this many seconds a forward instead of "
        "the measured time (a node whose speed varies with other work); unset: measured",
    )
    tokens_per_forward: int | None = Field(
        default=None, ge=1, description="rows x genes per model forward (the fixed row block)"
    )
    cuda_graphs: bool = Field(
        default=False,
        description="replay each forward block from a captured CUDA graph (CUDA only; never "
        "changes a cell)",
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="longest a request may take (504 after it)"
    )
    drain_timeout_s: float = Field(default=60.0, ge=0, description="SIGTERM: wait this long")
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a connection must send its request head within this many seconds (JSON 408)",
    )
    write_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a connection whose client reads nothing of its answers for this long (the "
        "send buffer full) is closed",
    )
    max_connections: int = Field(
        default=512, ge=1, description="open connections and requests at once (503 above it)"
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="bearer key every route but /healthz needs, compared as UTF-8 bytes; unset: "
        "no auth (set but empty: a start-up error)",
    )
    replicas: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None,
        description="run N replicas on Ray Serve (pip install -e '.[ray]'), or auto to scale "
        "between min_replicas and max_replicas; none: one process, no Ray",
    )
    min_replicas: int = Field(default=1, ge=1, description="replicas=auto: fewest replicas")
    max_replicas: int = Field(default=2, ge=1, description="replicas=auto: most replicas")
    gpus_per_replica: float | None = Field(
        default=None,
        ge=0,
        description="GPUs each replica reserves (fractions share a GPU); none: 1 where the Ray "
        "cluster has GPUs (0 with --device cpu), else 0",
    )
    cpus_per_replica: float = Field(default=1.0, gt=0, description="CPUs each replica reserves")
    threads_per_replica: int | None = Field(
        default=None, ge=1, description="torch threads in each replica (none: its CPUs)"
    )
    ray_address: str | None = Field(
        default=None,
        description="join this Ray cluster (e.g. auto, or HEAD_IP:6379); none: start a local one",
    )
    host: str = Field(default="127.0.0.1", description="interface to bind")
    port: int = Field(default=8000, ge=0, le=65535, description="port to listen on")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="log verbosity"
    )

    @field_validator("genes", "perturbation_map", "vectors", "models")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser().absolute()

    @field_validator("api_key")
    @classmethod
    def _a_key_or_none(cls, key: SecretStr | None) -> SecretStr | None:
        """An empty key (``SEDD_API_KEY=``) is neither on nor off: refused. A key with spaces
        around it could never be sent (the header's token is read without them)."""
        if key is None:
            return None
        value = key.get_secret_value()
        if not value.strip():
            raise ValueError(
                "SEDD_API_KEY is set but empty; unset it to serve without a key, or set a key"
            )
        if value != value.strip():
            raise ValueError(
                "SEDD_API_KEY starts or ends with whitespace, which a client cannot send; remove it"
            )
        return key

    @model_validator(mode="after")
    def _replica_range(self) -> Settings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas "
                f"({self.max_replicas})"
            )
        return self

    @property
    def serves_many(self) -> bool:
        """Whether a repository (``models``) or named models (``model_map``) are served, rather
        than the one ``model``."""
        return self.models is not None or bool(self.model_map)

    @property
    def rows_in_flight(self) -> int:
        """``max_rows_in_flight``, or 4 x ``max_rows_per_forward`` when unset."""
        if self.max_rows_in_flight is not None:
            return self.max_rows_in_flight
        return 4 * self.max_rows_per_forward

    def resolved_device(self) -> str:
        """``auto`` -> ``cuda`` when available, else ``cpu``."""
        if self.device != "auto":
            return self.device

        return default_device()
