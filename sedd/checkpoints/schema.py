"""Pydantic models shared by the server and the command line.

``ModelConfig`` is the native checkpoint's ``config.json``: everything a server needs besides the
weights (architecture, parametrisation, graph, noise, token vocabulary, gene names, label
vocabularies, provenance). Its schema is versioned: ``schema_version`` is written with every file,
and ``MIGRATIONS`` upgrades older dicts step by step before validation, so every file ever
written still loads. A new field must get a default (or a migration step that fills it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from sedd.checkpoints.migrations import MIGRATIONS, SCHEMA_VERSION, migrate

__all__ = [
    "MIGRATIONS",
    "RESERVED_OBS_COLUMNS",
    "SCHEMA_VERSION",
    "DDiTArch",
    "GeometricNoiseConfig",
    "GraphConfig",
    "LabelKind",
    "LogLinearNoiseConfig",
    "ModelConfig",
    "NoiseConfig",
    "Provenance",
    "ST3Arch",
    "ST3PerturbationArch",
    "TokenConfig",
    "migrate",
]


Architecture = Literal["st3", "st3_perturbation", "ddit"]
LabelKind = Literal["perturbation", "cell_type", "other"]
# obs columns of generated cells besides the label's own; a model's label_key may not be one
RESERVED_OBS_COLUMNS = ("condition_idx", "sample_idx", "cell_type", "seed", "cell_index")


class _Strict(BaseModel):
    # extra="forbid" catches typos, and lets the ``arch`` union pick its member unambiguously.
    model_config = ConfigDict(extra="forbid")


class _StrictArch(_Strict):
    # Dimensions are not coerced ("64" and true are not 64 and 1) and have upper bounds, so a
    # config is refused before any module is built (a meta-device model of 10**9 layers would
    # still take minutes and gigabytes to build).
    model_config = ConfigDict(extra="forbid", strict=True)


# Upper bounds: far above any model of our users (28k genes, 1,724 count tokens, width 256 to
# 1024, 8 to 24 layers) and far below what exhausts a machine.
GENES_MAX = 1_000_000
TOKENS_MAX = 1_000_000
WIDTH_MAX = 65_536
LAYERS_MAX = 1_024
HEADS_MAX = 1_024
LABELS_MAX = 10_000_000


class _ST3Trunk(_StrictArch):
    """The transformer both st3 networks share."""

    num_genes: int = Field(ge=1, le=GENES_MAX)
    num_bins: int = Field(ge=1, le=TOKENS_MAX)
    hidden_dim: int = Field(ge=1, le=WIDTH_MAX)
    num_layers: int = Field(ge=1, le=LAYERS_MAX)
    num_heads: int = Field(ge=1, le=HEADS_MAX)
    ff_mult: int = Field(default=4, ge=1, le=64)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)


class ST3Arch(_ST3Trunk):
    """Constructor arguments of ``sedd.models.st3.SEDDTransformer``."""

    max_seq_len: int | None = Field(default=None, ge=1, le=GENES_MAX)


class ST3PerturbationArch(_ST3Trunk):
    """Constructor arguments of ``sedd.models.st3.SEDDPerturbationTransformer``.

    ``conditioning``: "sum" (st3, and st3's cell-type family) or "separate_film" (aivc-dcm's
    SEDDPerturbationTransformerSeparateFiLM); ``cell_types_required``: rows must name a cell type
    (st3's cell-type family). ``provenance.source_class`` names the upstream class.
    """

    num_perturbations: int = Field(ge=1, le=LABELS_MAX)
    precomputed_emb_dim: int | None = Field(default=None, ge=1, le=WIDTH_MAX)
    num_cell_types: int | None = Field(default=None, ge=1, le=LABELS_MAX)
    conditioning: Literal["sum", "separate_film"] = "sum"
    cell_types_required: bool = False

    @model_validator(mode="after")
    def _cell_types_given(self) -> ST3PerturbationArch:
        if self.cell_types_required and not self.num_cell_types:
            raise ValueError(
                "cell_types_required is true, but num_cell_types is not set; give the model's "
                "number of cell types or set cell_types_required to false."
            )
        return self


class DDiTArch(_StrictArch):
    """Constructor arguments of ``sedd.models.ddit.DDiT`` (reference SEDD)."""

    vocab_size: int = Field(ge=2, le=TOKENS_MAX)
    hidden_size: int = Field(ge=1, le=WIDTH_MAX)
    cond_dim: int = Field(ge=1, le=WIDTH_MAX)
    n_blocks: int = Field(ge=1, le=LAYERS_MAX)
    n_heads: int = Field(ge=1, le=HEADS_MAX)
    length: int = Field(ge=1, le=GENES_MAX)
    graph: Literal["absorb", "uniform"]
    scale_by_sigma: bool = True
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)


class GraphConfig(_Strict):
    """``graph_from_config`` input (``sedd.diffusion.graph``); ``dim`` counts the mask too."""

    type: Literal["absorb", "uniform"]
    dim: int = Field(ge=2)


class LogLinearNoiseConfig(_Strict):
    type: Literal["loglinear"] = "loglinear"
    eps: float = Field(default=1e-3, gt=0.0, lt=1.0)


class GeometricNoiseConfig(_Strict):
    type: Literal["geometric"] = "geometric"
    sigma_min: float = Field(gt=0.0)
    sigma_max: float = Field(gt=0.0)


NoiseConfig = Annotated[LogLinearNoiseConfig | GeometricNoiseConfig, Field(discriminator="type")]


class TokenConfig(_Strict):
    """The token vocabulary: counts 0..num_bins-1, then the mask (absorbing graphs only).

    st3 calls the mask index ``num_bins``, so its largest count token is ``num_bins - 1``.
    """

    num_bins: int = Field(ge=1)
    mask_index: int | None
    vocab_size: int = Field(ge=2)

    @model_validator(mode="after")
    def _consistent(self) -> TokenConfig:
        expected = self.num_bins + (0 if self.mask_index is None else 1)
        if self.vocab_size != expected:
            raise ValueError(
                f"tokens.vocab_size must be num_bins ({self.num_bins}) plus one mask token if "
                f"there is one = {expected}, got {self.vocab_size}."
            )
        if self.mask_index is not None and self.mask_index != self.num_bins:
            raise ValueError(
                f"tokens.mask_index must be the last class {self.num_bins}, got {self.mask_index}."
            )
        return self

    @property
    def max_count(self) -> int:
        return self.num_bins - 1


class Provenance(BaseModel):
    """Where the weights came from. Unknown extra keys are kept (free-form notes)."""

    model_config = ConfigDict(extra="allow")

    source: str | None = None  # the path or name the model was converted from
    source_format: str | None = None  # "native", "st3", "sedd_hf", "sedd_run"
    source_file: str | None = None  # the weights file inside the source
    source_hash: str | None = None  # sha256 of that file
    training_command: str | None = None
    data_hash: str | None = None
    created: str | None = None  # ISO-8601 time the native files were written
    step: int | None = None  # training step recorded in the source checkpoint
    ema: bool | None = None  # True: EMA weights, False: raw weights, None: unknown
    training_args: dict[str, Any] | None = None  # st3's args.json / the reference config
    # the upstream class the weights were trained as (args.json's model_name, or the cell-type
    # class st3's trainer picks by model_size); None: the source names none
    source_class: str | None = None
    # the side file the gene names were read from (--genes, or st3's genes.json beside the
    # checkpoint) when the model was loaded or converted; None: no file named them
    genes_file: str | None = None
    # the {name: index} file the perturbation indices were read from (DCM's scalar labels)
    labels_file: str | None = None


def _arch_kind(value: Any) -> str:
    """Which arguments ``arch`` holds, from its keys: so a bad value is reported against that
    architecture only, not against all three."""
    kinds = {ST3Arch: "st3", ST3PerturbationArch: "st3_perturbation", DDiTArch: "ddit"}
    if type(value) in kinds:
        return kinds[type(value)]
    keys = set(value) if isinstance(value, dict) else set()
    if keys & {"vocab_size", "hidden_size", "n_blocks"}:
        return "ddit"
    return "st3_perturbation" if "num_perturbations" in keys else "st3"


class ModelConfig(_Strict):
    """The native ``config.json``."""

    schema_version: int = SCHEMA_VERSION
    architecture: Architecture
    arch: Annotated[
        Annotated[ST3Arch, Tag("st3")]
        | Annotated[ST3PerturbationArch, Tag("st3_perturbation")]
        | Annotated[DDiTArch, Tag("ddit")],
        Discriminator(_arch_kind),
    ]
    parametrisation: Literal["x0", "score"]
    graph: GraphConfig
    noise: NoiseConfig
    tokens: TokenConfig
    genes: list[str]  # model order: genes[i] is sequence position i
    genes_by_position: bool = False  # True when no gene list was given and genes are "0".."G-1"
    # perturbations[i] is label index i; None where no name has that index (a {name: index}
    # file with gaps, as DCM writes when a label file covers more rows than names)
    perturbations: list[str | None] | None = None
    control_label: str | None = None
    perturbation_vectors: bool = False  # perturbation_vectors.safetensors holds name -> vector
    cell_types: list[str] | None = None  # cell_types[i] is cell-type index i
    # The obs column the labels were trained from (the bundled model: "bulk_labels"); generated
    # cells carry their label under it, and under the generic "condition".
    label_key: str | None = None
    # What the labels are: only a perturbation model's cells get an obs["perturbation"] column.
    label_kind: LabelKind = "perturbation"
    provenance: Provenance = Field(default_factory=Provenance)

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return migrate(data)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        expected_arch = {
            "st3": ST3Arch,
            "st3_perturbation": ST3PerturbationArch,
            "ddit": DDiTArch,
        }[self.architecture]
        if not isinstance(self.arch, expected_arch):
            raise ValueError(
                f"`arch` does not hold {expected_arch.__name__} arguments, which architecture "
                f"{self.architecture!r} needs."
            )
        expected_param = "score" if self.architecture == "ddit" else "x0"
        if self.parametrisation != expected_param:
            raise ValueError(
                f"architecture {self.architecture!r} is {expected_param!r}-parametrised, "
                f"got parametrisation {self.parametrisation!r}."
            )
        self._check_vocabulary()
        self._check_labels()
        return self

    def _check_vocabulary(self) -> None:
        arch = self.arch
        if isinstance(arch, DDiTArch):
            vocab, graph_type = arch.vocab_size, arch.graph
        else:
            vocab, graph_type = arch.num_bins + 1, "absorb"
        if self.graph.type != graph_type or self.graph.dim != vocab:
            raise ValueError(
                f"graph must be {{'type': {graph_type!r}, 'dim': {vocab}}} for this "
                f"architecture, got {self.graph.model_dump()}."
            )
        if self.tokens.vocab_size != vocab:
            raise ValueError(f"tokens.vocab_size must be {vocab}, got {self.tokens.vocab_size}.")
        if (self.tokens.mask_index is None) != (graph_type == "uniform"):
            raise ValueError(
                f"tokens.mask_index must be set for an absorbing graph and null for a uniform "
                f"one, got {self.tokens.mask_index} with graph {graph_type!r}."
            )

    def _check_labels(self) -> None:
        _check_names("genes", self.genes, self.num_genes)
        if self.perturbations is not None:
            _check_names("perturbations", self.perturbations, self.num_perturbations)
        if self.cell_types is not None:
            _check_names("cell_types", self.cell_types, self.num_cell_types)
        if self.label_key is not None and (
            not self.label_key.strip() or self.label_key in RESERVED_OBS_COLUMNS
        ):
            raise ValueError(
                f"`label_key` must be a non-empty obs column name other than "
                f"{', '.join(RESERVED_OBS_COLUMNS)}, got {self.label_key!r}; use the "
                "column the labels were trained from (or null)."
            )
        vector_dim = getattr(self.arch, "precomputed_emb_dim", None)
        if self.perturbation_vectors and not vector_dim:
            raise ValueError(
                "perturbation_vectors is true, but the model has no precomputed_emb_dim: it "
                "cannot take perturbation vectors."
            )
        if (
            self.control_label is not None
            and self.perturbations is not None
            and not self.perturbation_vectors
            and self.control_label not in self.perturbations
        ):
            raise ValueError(
                f"control_label {self.control_label!r} is not one of the perturbations."
            )

    @property
    def label_columns(self) -> list[str]:
        """The obs columns that name a generated cell's label ([] for unconditional models):
        ``condition`` (every conditional model), ``label_key`` (the training column) and
        ``perturbation`` (perturbation models only)."""
        if not self.num_perturbations:
            return []
        columns = ["condition", self.label_key or "", "perturbation"]
        if self.label_kind != "perturbation":
            columns.remove("perturbation")
        return [c for c in dict.fromkeys(columns) if c]

    @property
    def num_genes(self) -> int:
        return self.arch.length if isinstance(self.arch, DDiTArch) else self.arch.num_genes

    @property
    def num_perturbations(self) -> int:
        """Rows of the label embedding; 0 for unconditional models."""
        return self.arch.num_perturbations if isinstance(self.arch, ST3PerturbationArch) else 0

    @property
    def num_cell_types(self) -> int:
        if isinstance(self.arch, ST3PerturbationArch):
            return self.arch.num_cell_types or 0
        return 0


def _check_names(field: str, names: Sequence[str | None], expected: int) -> None:
    if len(names) != expected:
        raise ValueError(f"`{field}` must list {expected} names (the model's), got {len(names)}.")
    if None in names and field != "perturbations":
        raise ValueError(f"`{field}` must name every index; entry {names.index(None)} is null.")
    if all(name is None for name in names):
        raise ValueError(f"`{field}` must name at least one index; all are null.")
    repeated = [name for name, n in Counter(names).items() if n > 1 and name is not None]
    if repeated:
        raise ValueError(f"`{field}` names must be unique; repeated: {repeated[:10]}.")
