"""A clock a test moves itself: ``Engine(clock=...)`` takes it for deadlines, queue waits and
tick times, so a test of a deadline never sleeps and never depends on how fast this machine
steps (the forward's own cost is ``Engine(forward_cost_s=...)``)."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds that move only when ``advance`` is called."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back ({seconds} s)")
        self.now += seconds
