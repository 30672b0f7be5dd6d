"""The tables ``sedd quality`` prints: one a part of the report (``sedd.eval.quality_report``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def report_tables(result: dict[str, Any]) -> list[Table]:
    """The report as rich tables: recovery, within-label agreement, markers, the rest."""
    tables = [_recovery_table(result["subpopulations"]), _within_label_table(result)]
    if result["markers"]:
        tables.append(_marker_table(result["markers"]))
    return [*tables, _summary_table(result)]


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for k, column in enumerate(columns):
        table.add_column(column, justify="left" if k == 0 else "right")
    return table


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _recovery_table(recovery: dict[str, Any]) -> Table:
    table = _table(
        f"sub-population recovery: {recovery['labels_recovered']} of "
        f"{recovery['labels_checked']} labels (held-out real cells: "
        f"{recovery.get('held_out_labels_recovered', '-')}); Leiden on real + generated cells, "
        f"{recovery['n_clusters']} clusters; every real sub-cluster with >= "
        f"{recovery['min_share']:.0%} of a label's real cells needs a share within "
        f"+-{recovery['tolerance'] * 100:.0f} points",
        "label", "cells: real / gen / held-out", "cluster", "real share", "generated share",
        "held-out share", "recovered: gen / held-out",
    )  # fmt: skip
    for label, entry in recovery["labels"].items():
        cells = f"{entry['n_real']} / {entry['n_generated']} / {entry.get('n_held_out', '-')}"
        verdict = f"{_yes(entry['recovered'])} / {_yes(entry.get('held_out_recovered'))}"
        for k, cluster in enumerate(entry["clusters"]):
            first = k == 0
            table.add_row(
                label if first else "",
                cells if first else "",
                cluster["cluster"],
                f"{cluster['real_share']:.2f}",
                _share(cluster, "generated"),
                _share(cluster, "held_out"),
                verdict if first else "",
            )
    return table


def _yes(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "[red]no[/red]"


def _share(cluster: dict[str, Any], name: str) -> str:
    if f"{name}_share" not in cluster:
        return "-"
    share = f"{cluster[f'{name}_share']:.2f}"
    return share if cluster[f"{name}_within_tolerance"] else f"[red]{share}[/red]"


def _within_label_table(result: dict[str, Any]) -> Table:
    agreement = result["within_label_agreement"]
    table = _table(
        "within-label gene-gene correlation agreement with the training cells (Pearson r)",
        "label", "training", "held-out", "held-out r", "generated", "generated r",
    )  # fmt: skip
    for label, entry in agreement["per_label"].items():
        table.add_row(
            label,
            str(entry["n_train"]),
            str(entry["n_held_out"]),
            _number(entry["held_out"]),
            str(entry["n_generated"]),
            _number(entry["generated"]),
        )
    cells = result["inputs"]["cells"]
    table.add_row(
        "all labels (100 genes of the training cells)",
        str(cells["train"]),
        str(cells["held_out"]),
        _number(agreement["all_labels"]["held_out"]),
        str(cells["generated"]),
        _number(agreement["all_labels"]["generated"]),
    )
    return table


def _marker_table(markers: dict[str, Any]) -> Table:
    table = _table(
        "marker scores: mean log1p(normalised counts) of the markers, quantiles",
        "label", "cells", "n", "q10", "q25", "q50", "q75", "q90",
    )  # fmt: skip
    for label, entry in markers.items():
        for side, name in (("real", "real"), ("generated", "generated")):
            q = entry[side]
            table.add_row(
                label if side == "real" else f"({', '.join(entry['genes'])})",
                name,
                str(entry[f"n_{side}"]),
                *(_number(q.get(f"q{p}"), 2) for p in (10, 25, 50, 75, 90)),
            )
    return table


def _summary_table(result: dict[str, Any]) -> Table:
    knn, distances = result["label_knn_accuracy"], result["distances"]
    guard = result["memorisation"]
    table = _table("label accuracy, distances, memorisation", "figure", "generated", "real")
    table.add_row(
        f"label kNN accuracy (k={knn['generated']['n_neighbors']}, fitted on training cells)",
        _number(knn["generated"]["accuracy"]),
        f"{_number(knn['held_out']['accuracy'])} (held-out)",
    )
    for key, name, digits in (("energy_distance", "energy distance", 3), ("mmd2_rbf", "MMD^2", 4)):
        d = distances[key]
        table.add_row(
            f"{name} vs held-out (mean +- sd over seeds; real: noise floor)",
            _mean_sd(d["generated_mean"], d["generated_sd"], digits),
            _mean_sd(d["floor_mean"], d["floor_sd"], digits),
        )
    table.add_row(
        "nearest training cell, median distance",
        _number(guard["generated_median"]),
        f"{_number(guard['held_out_median'])} (held-out)",
    )
    table.add_row(
        "nearest training cell, 5th percentile",
        _number(guard["generated_p5"]),
        f"{_number(guard['held_out_p5'])} (held-out)",
    )
    table.add_row(
        "share closer than the held-out 5th percentile",
        _number(guard["closer_than_held_out_p5"]),
        f"{guard['expected_share']:.2f} (expected)",
    )
    table.add_row("generated cells copying a training cell", str(guard["exact_copies"]), "0")
    return table


def _mean_sd(mean: float, sd: float | None, digits: int) -> str:
    return _number(mean, digits) + ("" if sd is None else f" +- {_number(sd, digits)}")
