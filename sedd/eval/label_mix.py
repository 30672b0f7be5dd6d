"""Do two sets of cells have the same label mix? Pooled figures (kNN AUC, MMD^2, energy and
Frechet distance) compare the sets as wholes, so a set of 20 cells of each label against a test
split of 36 Dendritic cells and 3 of the rest scores the difference in composition as much as
the generator. ``compare_label_mixes`` measures that difference; ``sedd evaluate`` warns on it
and reports per-label figures next to the pooled ones."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Total variation between the two label proportions above which the mixes are called different:
# 5% of the cells would have to change label to make them equal.
MIX_TOLERANCE = 0.05


@dataclass(frozen=True)
class LabelMixComparison:
    real: dict[str, int]  # cells of each label, largest first
    generated: dict[str, int]
    total_variation: float  # half the L1 distance between the label proportions, 0..1

    @property
    def matched(self) -> bool:
        return self.total_variation <= MIX_TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        """The comparison for metrics.json."""
        return {
            "real": self.real,
            "generated": self.generated,
            "total_variation": self.total_variation,
            "matched": self.matched,
            "tolerance": MIX_TOLERANCE,
        }

    def warning(self, real_key: str, generated_file: str) -> str | None:
        """One line for the user when the mixes differ, saying what to do; None when matched."""
        if self.matched:
            return None
        return (
            f"the label mixes differ (total variation {self.total_variation:.2f} between the "
            f"label proportions; real: {_top(self.real)}; generated: {_top(self.generated)}), "
            "so the pooled figures measure the difference in composition too: read the "
            "per-label table, or generate the real mix with `sedd generate --like "
            f"<real .h5ad> --condition-key {real_key}` (instead of {generated_file})"
        )


def compare_label_mixes(real: Iterable[object], generated: Iterable[object]) -> LabelMixComparison:
    """The two sets' cells per label (labels compared as strings; missing labels skipped) and
    the total variation between their proportions."""
    real_counts, gen_counts = _counts(real), _counts(generated)
    n_real, n_gen = sum(real_counts.values()), sum(gen_counts.values())
    if not n_real or not n_gen:
        raise ValueError("a label mix needs labelled cells on both sides.")
    labels = set(real_counts) | set(gen_counts)
    distance = 0.5 * sum(abs(real_counts[x] / n_real - gen_counts[x] / n_gen) for x in labels)
    return LabelMixComparison(
        dict(real_counts.most_common()), dict(gen_counts.most_common()), round(distance, 6)
    )


def _counts(labels: Iterable[object]) -> Counter[str]:
    return Counter(str(x) for x in labels if x is not None and x == x)  # NaN != NaN


def _top(counts: dict[str, int], shown: int = 4) -> str:
    items = [f"{n} {label}" for label, n in list(counts.items())[:shown]]
    more = len(counts) - shown
    return ", ".join(items) + (f" and {more} more labels" if more > 0 else "")
