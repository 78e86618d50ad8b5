"""What a backward pass's own memory did, position by position, and how far prefetching may
fill the device at each position of the next backward of the same shape.

Prefetching must leave room for what backward itself will still allocate.  Before a lesson
exists the swapper keeps, for the whole of backward, the margin (backward's peak need over
forward's end) and never fills past forward's end.  Where backward's peak comes first (a
language model's loss: the gradient of fp32 logits larger than every saved tensor), that
room is kept long after the peak has passed, and every swapped tensor comes back on demand:
a checkpointed decoder at twice stock's batch on the H100 fetched all 21 of its swapped
tensors on demand, with prefetching blocked from backward's first op.

A backward is cut into intervals at each unpack of a swapped tensor.  Each interval keeps
its start (the saved tensor's forward offset: bytes saved before it, the same in every step
of a shape whatever was swapped), the device allocation there and its own peak, both less
the bytes prefetched and not yet used (so they measure backward's own need, not how far
prefetching went).  The lesson is, per offset, the highest own level over the rest of
backward: absolute, and as growth over the level where the interval began.  The next
backward may fill the device while its allocation, plus what its own need will still grow
by (the larger of the two forecasts), stays under the limit less a pad and under the last
backward's peak, so that the margin, which is learned from that peak, is not fed by
prefetching.  A backward in which the eviction net had to move memory teaches nothing and
doubles the pad where the lesson was in use.  Nor does a step whose forward needed the net:
the next step of its shape swaps more by plan, so its backward starts lower and brings back
other tensors, and this backward's levels include the on-demand return of what the net
moved (on the H100 a decoder at 1.5x whose length cycles: such a lesson let the next step
of that length prefetch into the net, 3.8 GB synchronously).
"""

from __future__ import annotations

import bisect
from typing import Callable, List, NamedTuple, Optional

__all__ = ["BackwardLesson", "BackwardProfile", "observe"]

START = float("inf")  # the interval from backward's start to its first swapped unpack
MiB = 1 << 20

# what observe() was given: told of each backward's start and of each interval as it closes
_observer: Optional[Callable[[str, dict], None]] = None


def observe(fn: Optional[Callable[[str, dict], None]]) -> None:
    """Has ``fn(event, fields)`` called as backwards are recorded (None: no longer), for
    a probe of where backward's memory goes (examples/pytorch/benchmarks/backward_memory.py):
    ``("begin", {"level"})`` as a backward starts, ``("interval", {"key", "level", "peak",
    "ahead"})`` as each interval closes (its forward offset, None for the one before the
    first unpack; the allocation where it began, its peak, the bytes prefetched and not yet
    used then) and ``("end", {"peak"})`` as the backward's record ends.  Bytes throughout;
    nothing is called where no observer is set."""
    global _observer
    _observer = fn


class BackwardLesson(NamedTuple):
    keys: List[float]      # interval starts (forward offsets), ascending
    growth: List[int]      # own peak over the rest of backward less the own level there
    rest_peak: List[int]   # own peak over the rest of backward (absolute)
    top: int               # backward's peak as measured (prefetched bytes included)

    def at(self, key: float) -> tuple:
        """(growth, rest_peak) of the interval under way at ``key``: the one that began
        at the smallest offset not below it (backward visits offsets downwards)."""
        i = bisect.bisect_left(self.keys, key)
        i = min(i, len(self.keys) - 1)
        return self.growth[i], self.rest_peak[i]


class BackwardProfile:
    """Records one backward's intervals; learns a :class:`BackwardLesson` at its end."""

    def __init__(self) -> None:
        self.ahead = 0          # bytes prefetched and not yet unpacked
        self.pad: Optional[int] = None  # kept free under the limit by the lesson's rule
        self.used = False       # this backward prefetched further than the old rule
        self.key = START
        self._recs: List[list] = []  # [key, own level at start, own peak or None]
        self._level = 0         # allocation where the running peak was last marked
        self._ahead_at_mark = 0
        self._peak = 0

    # -- recording ------------------------------------------------------------------
    def begin(self, level: int) -> None:
        """Backward starts at ``level`` bytes allocated (the running peak is marked)."""
        self.ahead = 0
        self.used = False
        self.key = START
        self._recs = [[START, int(level), None]]
        self._level = self._peak = int(level)
        self._ahead_at_mark = 0
        if _observer is not None:
            _observer("begin", {"level": int(level)})

    @property
    def recording(self) -> bool:
        return bool(self._recs)

    def _close(self, growth: int) -> None:
        peak = self._level + max(0, int(growth))
        self._peak = max(self._peak, peak)
        self._recs[-1][2] = peak - self._ahead_at_mark
        if _observer is not None:
            _observer("interval", {"key": None if self.key == START else int(self.key),
                                   "level": int(self._level), "peak": int(peak),
                                   "ahead": int(self._ahead_at_mark)})

    def boundary(self, key: int, growth: int, level: int) -> None:
        """A swapped tensor saved at forward offset ``key`` is unpacked: the interval
        under way ends (its peak is the level at its mark plus ``growth``, the running
        peak's growth since), the next begins at ``level`` (the running peak is marked
        again by the caller)."""
        if not self._recs:
            return
        self._close(growth)
        self._recs.append([int(key), int(level) - self.ahead, None])
        self._level = int(level)
        self._ahead_at_mark = self.ahead
        self.key = int(key)

    def prefetched(self, nbytes: int) -> None:
        self.ahead += int(nbytes)

    def consumed(self, nbytes: int) -> None:
        """Prefetched bytes were unpacked, or dropped unused."""
        self.ahead = max(0, self.ahead - int(nbytes))

    def settle(self) -> None:
        """Prefetching at a boundary is done: what it brought is the interval's too."""
        self._ahead_at_mark = self.ahead

    def end(self, growth: int, evicted: int, limit: int, forward_evicted: int = 0) -> tuple:
        """Backward ended (``growth``: the running peak's since the last mark; ``evicted``:
        bytes the eviction net moved in it; ``forward_evicted``: in the forward before it).
        Returns (its peak, the lesson or None)."""
        if not self._recs:
            return None, None
        self._close(growth)
        recs, self._recs = self._recs, []
        if _observer is not None:
            _observer("end", {"peak": int(self._peak)})
        if evicted > 0 and self.used:
            floor = max(256 * MiB, int(limit) // 64)
            self.pad = min(int(limit) // 8, 2 * (self.pad or floor))
        if evicted > 0 or forward_evicted > 0:
            return self._peak, None
        by_key = {}
        rest = None
        for key, start, peak in reversed(recs):
            rest = peak if rest is None else max(rest, peak)
            g, r = by_key.get(key, (0, 0))
            by_key[key] = (max(g, rest - start), max(r, rest))
        keys = sorted(by_key)
        return self._peak, BackwardLesson(keys, [by_key[k][0] for k in keys],
                                          [by_key[k][1] for k in keys], int(self._peak))

    # -- use --------------------------------------------------------------------------
    def room(self, lesson: Optional[BackwardLesson], limit: int, allocated: int,
             reserve: int = 0) -> Optional[int]:
        """Bytes prefetching may still bring back now by ``lesson`` (None: no lesson),
        keeping at least ``reserve`` free under the limit (the caller's: a multiple of
        the largest swapped tensor still to come back, whose own allocations the
        lesson's intervals may have missed between two reads)."""
        if lesson is None:
            return None
        pad = self.pad if self.pad is not None else max(256 * MiB, int(limit) // 64)
        pad = max(pad, int(reserve))
        growth, rest_peak = lesson.at(self.key)
        own = int(allocated) - self.ahead
        need = max(own + growth, rest_peak)
        return min(int(limit) - pad, lesson.top) - need - self.ahead
