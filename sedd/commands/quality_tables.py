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
    seeds = len(recovery["labels_recovered_per_seed"])
    recovered = _mean_sd(recovery["labels_recovered_mean"], recovery["labels_recovered_sd"], 1)
    table = _table(
        f"sub-population recovery: {recovered} of {recovery['labels_checked']} labels a seed "
        f"({seeds} seed(s), each the held-out cells' size and label mix; held-out real cells: "
        f"{recovery['held_out_labels_recovered']}); Leiden on real + generated cells, "
        f"{recovery['n_clusters']} clusters; every real sub-cluster with >= "
        f"{recovery['min_share']:.0%} of a label's real cells needs a share within "
        f"+-{recovery['tolerance'] * 100:.0f} points",
        "label", "cells: real / gen a seed / held-out", "cluster", "real share",
        "generated share (mean over seeds)", "held-out share", "recovered: seeds / held-out",
    )  # fmt: skip
    for label, entry in recovery["labels"].items():
        made = "/".join(str(n) for n in sorted(set(entry["n_generated_per_seed"])))
        cells = f"{entry['n_real']} / {made} / {entry['n_held_out']}"
        verdict = f"{entry['seeds_recovered']} of {seeds} / {_yes(entry['held_out_recovered'])}"
        for k, cluster in enumerate(entry["clusters"]):
            first = k == 0
            table.add_row(
                label if first else "",
                cells if first else "",
                cluster["cluster"],
                f"{cluster['real_share']:.2f}",
                _share(cluster["generated_share_mean"], cluster, recovery["tolerance"]),
                _share(cluster["held_out_share"], cluster, recovery["tolerance"]),
                verdict if first else "",
            )
    return table


def _yes(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "[red]no[/red]"


def _share(share: float, cluster: dict[str, Any], tolerance: float) -> str:
    """A share, red when it is further than ``tolerance`` from the real share."""
    text = f"{share:.2f}"
    return text if abs(share - cluster["real_share"]) <= tolerance else f"[red]{text}[/red]"


def _within_label_table(result: dict[str, Any]) -> Table:
    agreement = result["within_label_agreement"]
    table = _table(
        "within-label gene-gene correlation agreement with the training cells (Pearson r); "
        "generated: mean +- sd over seeds, each set the held-out size and label mix; pooled: "
        "every seed's cells together (more cells read higher: not comparable with held-out)",
        "label", "training", "held-out", "held-out r", "generated a seed", "generated r",
        "pooled", "pooled r",
    )  # fmt: skip
    for label, entry in agreement["per_label"].items():
        table.add_row(
            label,
            str(entry["n_train"]),
            str(entry["n_held_out"]),
            _number(entry["held_out"]),
            "/".join(str(n) for n in sorted(set(entry["n_generated_per_seed"]))),
            _mean_sd(entry["generated_mean"], entry["generated_sd"], 3),
            str(entry["n_generated_pooled"]),
            _number(entry["generated_pooled"]),
        )
    everything = agreement["all_labels"]
    cells = everything["cells"]
    table.add_row(
        "all labels (100 genes of the training cells)",
        str(result["inputs"]["cells"]["train"]),
        str(cells["held_out"]),
        _number(everything["held_out"]),
        "/".join(str(n) for n in sorted(set(cells["generated_per_seed"]))),
        _mean_sd(everything["generated_mean"], everything["generated_sd"], 3),
        str(cells["generated_pooled"]),
        _number(everything["generated_pooled"]),
    )
    return table


def _marker_table(markers: dict[str, Any]) -> Table:
    table = _table(
        "marker scores: mean log1p(normalised counts) of the markers, quantiles",
        "label", "cells", "n", "q10", "q25", "q50", "q75", "q90",
    )  # fmt: skip
    for label, entry in markers.items():
        for side, name in (("real", "real"), ("generated", "generated, all seeds")):
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
    table = _table(
        "label accuracy, distances, memorisation (generated: mean +- sd over seeds, each set "
        "the held-out size and label mix, unless pooled)",
        "figure", "generated", "real",
    )  # fmt: skip
    table.add_row(
        f"label kNN accuracy (k={knn['held_out']['n_neighbors']}, fitted on training cells)",
        _mean_sd(knn["generated_accuracy_mean"], knn["generated_accuracy_sd"], 3),
        f"{_number(knn['held_out']['accuracy'])} (held-out)",
    )
    for key, name, digits in (("energy_distance", "energy distance", 3), ("mmd2_rbf", "MMD^2", 4)):
        d = distances[key]
        table.add_row(
            f"{name} vs held-out (real: noise floor, mean +- sd over draws)",
            _mean_sd(d["generated_mean"], d["generated_sd"], digits),
            _mean_sd(d["floor_mean"], d["floor_sd"], digits),
        )
    table.add_row(
        "nearest training cell, median distance (pooled)",
        _number(guard["generated_median"]),
        f"{_number(guard['held_out_median'])} (held-out)",
    )
    table.add_row(
        "nearest training cell, 5th percentile (pooled)",
        _number(guard["generated_p5"]),
        f"{_number(guard['held_out_p5'])} (held-out)",
    )
    table.add_row(
        "share closer than the held-out 5th percentile",
        _mean_sd(guard["closer_than_held_out_p5_mean"], guard["closer_than_held_out_p5_sd"], 3),
        f"{guard['expected_share']:.2f} (expected)",
    )
    table.add_row(
        "generated cells copying a training cell (pooled)", str(guard["exact_copies"]), "0"
    )
    return table


def _mean_sd(mean: float | None, sd: float | None, digits: int) -> str:
    return _number(mean, digits) + ("" if sd is None else f" +- {_number(sd, digits)}")
