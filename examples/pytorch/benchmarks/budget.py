"""A benchmark run's time budget: what is left of it, and whether one more configuration
should start.  A configuration that cannot finish spends what is left and records nothing,
so none starts when less is left than the longest one this run has finished took (or than
a floor, before any has finished)."""
from __future__ import annotations

import time
from typing import Optional

__all__ = ["Budget", "mark_if_cut"]


class Budget:
    def __init__(self, seconds: float, floor: float):
        self.seconds = seconds
        self.floor = floor
        self.longest = 0.0  # wall seconds of the longest configuration finished so far
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def finished(self, result: dict) -> None:
        """Takes a configuration's result: a finished one's wall time is the estimate of the
        next one's."""
        if result.get("status") == "ok":
            self.longest = max(self.longest, float(result.get("wall_s") or 0.0))

    def refusal(self) -> Optional[str]:
        """None while one more configuration may start, else its row's status saying why not."""
        left = self.left()
        if left >= max(self.floor, self.longest):
            return None
        return (f"not run (time budget: {left:.0f} s left, the longest configuration so far "
                f"took {self.longest:.0f} s)")


def mark_if_cut(row: dict, result: dict, limit: float, cap: float) -> None:
    """Marks ``row`` ``cut_by_budget`` where what was left of the run's budget (``limit``,
    under the configuration's own ``cap``) stopped it: a row that finished within that limit
    was not cut, and carries no mark."""
    if limit < cap and str(result.get("status", "")).startswith("timeout"):
        row["cut_by_budget"] = True
