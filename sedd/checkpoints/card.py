"""The model card: what ``sedd info``, ``GET /v1/models`` and ``sedd.Model.card`` show."""

from __future__ import annotations

from typing import Any

from sedd.checkpoints.loaded import LoadedModel


def model_card_dict(loaded: LoadedModel) -> dict[str, Any]:
    config = loaded.config
    vectors = loaded.perturbation_vectors
    perturbation_model = config.label_kind == "perturbation"
    return {
        "path": str(loaded.path),
        "layout": loaded.layout,
        "weights_file": str(loaded.weights_file) if loaded.weights_file else None,
        "sha256": loaded.file_hash,
        "architecture": config.architecture,
        "arch": config.arch.model_dump(),
        "num_parameters": loaded.num_parameters,
        "parametrisation": config.parametrisation,
        "graph": config.graph.model_dump(),
        "noise": config.noise.model_dump(),
        "tokens": config.tokens.model_dump(),
        "num_genes": config.num_genes,
        "genes_by_position": config.genes_by_position,
        "genes": config.genes,
        "conditions": loaded.conditions,
        # the condition a request without one falls back to (a cell-type model's reference for
        # predict); perturbation words only for perturbation models, as the HTTP card has them
        "default_condition": config.control_label if config.num_perturbations else None,
        "perturbations": config.perturbations if perturbation_model else None,
        "control_label": config.control_label if perturbation_model else None,
        "perturbation_vector_names": None if vectors is None else list(vectors),
        "cell_types": config.cell_types,
        "label_key": config.label_key,
        "label_kind": config.label_kind,
        "label_columns": config.label_columns,
        "provenance": config.provenance.model_dump(exclude={"training_args"}),
        "schema_version": config.schema_version,
        # what a request that names no schedule runs (calibration.json, else the library's)
        "default_schedule": loaded.schedule.record(),
        "schedule_calibrated": loaded.calibrated,
    }


def _preview(names: list[str], head: int = 5, tail: int = 3) -> str:
    if len(names) <= head + tail:
        return ", ".join(names)
    return ", ".join(names[:head]) + ", ..., " + ", ".join(names[-tail:])


def model_card(loaded: LoadedModel) -> str:
    """A human-readable summary of ``loaded``."""
    config, arch = loaded.config, loaded.config.arch.model_dump()
    tokens, noise = config.tokens, config.noise.model_dump()
    noise_text = ", ".join(f"{k}={v}" for k, v in noise.items() if k != "type")
    shape = ", ".join(f"{k}={v}" for k, v in arch.items())
    rows = [
        ("model", f"{loaded.path} ({loaded.layout})"),
        ("architecture", f"{config.architecture}: {shape}"),
        ("parameters", f"{loaded.num_parameters:,}"),
        ("parametrisation", config.parametrisation),
        ("graph", f"{config.graph.type}, dim {config.graph.dim}"),
        ("noise", f"{noise['type']} ({noise_text})"),
        (
            "vocabulary",
            f"{tokens.vocab_size} tokens: counts 0..{tokens.max_count}"
            + (f", mask {tokens.mask_index}" if tokens.mask_index is not None else ", no mask"),
        ),
        (
            "genes",
            f"{config.num_genes}: {_preview(config.genes)}"
            + (" (named by position; no gene list given)" if config.genes_by_position else ""),
        ),
    ]
    if config.num_perturbations:
        names = loaded.conditions if config.perturbations is not None else None
        text = f"{len(names)}: {_preview(names)}" if names else "indices only (no names)"
        rows.append((f"{loaded.label_word}s", text))
        if config.label_kind == "perturbation":
            rows.append(("control label", str(config.control_label)))
        else:  # not a perturbation model: its "control" is only the default condition
            default = config.control_label or "none (pass a condition)"
            rows.append(("default condition", default))
        rows.append(
            ("labels", f"{config.label_kind}s, in obs as {', '.join(config.label_columns)}")
        )
        if loaded.perturbation_vectors is not None:
            vec_names = list(loaded.perturbation_vectors)
            dim = next(iter(loaded.perturbation_vectors.values())).shape[0]
            rows.append(("vectors", f"{len(vec_names)} x {dim}: {_preview(vec_names)}"))
    if config.num_cell_types:
        cell_types = config.cell_types
        rows.append(("cell types", _preview(cell_types) if cell_types else "indices only"))
    prov = config.provenance
    source = f"{prov.source_format or '?'} {prov.source or '?'}"
    if prov.source_file:
        source += f" [{prov.source_file}]"
    rows.append(("source", source))
    if prov.source_class:  # the upstream class it was trained as (DCM's model_name, say)
        rows.append(("upstream class", prov.source_class))
    for label, value in (
        ("step", prov.step),
        ("ema", prov.ema),
        ("training command", prov.training_command),
        ("data hash", prov.data_hash),
        ("created", prov.created),
        ("source sha256", prov.source_hash if prov.source_hash != loaded.file_hash else None),
    ):
        if value is not None:
            rows.append((label, str(value)))
    rows.append(("sha256", f"{loaded.file_hash} ({loaded.weights_file})"))
    schedule = ", ".join(f"{key} {value}" for key, value in loaded.schedule.record().items())
    where = "calibration.json" if loaded.calibrated else "the library's default"
    rows.append(("default schedule", f"{schedule} ({where})"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
