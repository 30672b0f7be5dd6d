"""Which perturbations a prediction covers: names from flags or a file, plus the control.

Shared by every front door (``sedd predict``, the API, the server and the st3-compatible
scripts), so all resolve names the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import anndata

from sedd.checkpoints import LoadedModel
from sedd.io.read import read_h5ad_safely


def read_perturbation_file(path: str | Path) -> list[str]:
    """Names one a line (st3's ``--perturbations_file``); blank lines and ``#`` comments skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"perturbations file not found: {path}")
    names = []
    for line in path.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    if not names:
        raise ValueError(f"perturbations file {path} lists no names (one name a line).")
    return names


def perturbation_conditions(
    loaded: LoadedModel,
    names: Sequence[str] | None,
    *,
    include_control: bool = True,
    control: str | None = None,
) -> list[str]:
    """The conditions to generate, control first.

    ``names`` None means every label the model knows. ``control`` overrides the model's
    ``control_label``; with ``include_control`` it is added when missing, without it removed.
    Duplicates are dropped (first one kept). Unknown names raise ``UnknownLabelError``.
    """
    known = loaded.conditions
    if not loaded.conditional:
        raise ValueError(f"{loaded.path} is an unconditional model; use `sedd generate`.")
    if not known:
        raise ValueError(
            f"{loaded.path} has no perturbation names; pass the label mapping "
            "(--perturbation-map FILE; st3 scripts: --perturbations_all_file)."
        )
    control = control if control is not None else loaded.config.control_label
    if control is not None:
        loaded.perturbation_labels([control])  # raises with suggestions if unknown
    chosen = list(dict.fromkeys(names if names is not None else known))
    for name in chosen:
        loaded.perturbation_labels([name])  # raises with suggestions if unknown
    if control is not None:
        chosen = [name for name in chosen if name != control]
        if include_control:
            chosen.insert(0, control)
    if not chosen:
        raise ValueError(
            f"nothing to generate: the only perturbation given is the control {control!r}, and "
            "leaving out the control (--no-control, include_control=False) removes it."
        )
    return chosen


def single_condition(loaded: LoadedModel, given: str | None) -> tuple[str, ...] | None:
    """The one condition of an imputation (and of the server's /generate): ``given``, else the
    control. ``None`` for an unconditional model, which must not be given one."""
    if not loaded.conditional:
        if given is not None:
            raise ValueError(
                f"`condition` must be left out: this model is unconditional, got {given!r}."
            )
        return None
    name = given if given is not None else loaded.config.control_label
    if name is None:
        raise ValueError(
            "`condition` must be given: this model is conditional and has no control label."
        )
    return (name,)


def label_mix(
    loaded: LoadedModel, like: object, condition_key: str | None = None
) -> tuple[list[str], list[int]]:
    """(conditions, cells of each) as many as ``like`` has of each label: an AnnData (or an
    .h5ad path, read without its counts) whose obs column ``condition_key`` (default: the
    model's training key) labels its cells. Labels come in the model's order."""
    if not loaded.conditional:
        raise ValueError("`like` needs a conditional model: this one is unconditional.")
    key = condition_key if condition_key is not None else loaded.config.label_key
    if key is None:
        raise ValueError("`condition_key` must be given: the model records no training key.")
    if isinstance(like, (str, Path)):
        path = Path(like)
        if not path.is_file():
            raise FileNotFoundError(f"`like` {path} is not a file; pass an .h5ad of cells.")
        obs = read_h5ad_safely(path, what="`like`", backed="r").obs
    elif isinstance(like, anndata.AnnData):
        obs = like.obs
    else:
        raise TypeError(f"`like` must be an AnnData or an .h5ad path, got {type(like).__name__}.")
    if key not in obs.columns:
        columns = ", ".join(str(c) for c in obs.columns[:10]) or "none"
        raise ValueError(
            f"`condition_key` {key!r} is not an obs column of `like` (columns: {columns})."
        )
    labels = obs[key].dropna().astype(str)
    if labels.empty:
        raise ValueError(f"`like` has no labelled cells in obs[{key!r}].")
    counts = labels.value_counts()
    return mix_counts(loaded, {str(name): int(n) for name, n in counts.items()})


def mix_counts(loaded: LoadedModel, counts: Mapping[str, int]) -> tuple[list[str], list[int]]:
    """(conditions, cells of each) for a label mix ``{name: cells}``, in the model's order of
    conditions whatever the mapping's order, so one mix always numbers its cells the same way.
    Unknown names raise ``UnknownLabelError``; a name with 0 cells is left out."""
    if not loaded.conditional:
        raise ValueError("a label mix needs a conditional model: this one is unconditional.")
    order = {name: i for i, name in enumerate(loaded.conditions)}
    names = sorted(counts, key=lambda name: (order.get(name, len(order)), name))
    for name in names:
        loaded.perturbation_labels([name])  # raises UnknownLabelError with suggestions
        if counts[name] < 0:
            raise ValueError(f"a label mix needs counts >= 0, got {counts[name]} for {name!r}.")
    names = [name for name in names if counts[name] > 0]
    if not names:
        raise ValueError("the label mix asks for no cells: give at least one count above 0.")
    return names, [int(counts[name]) for name in names]
