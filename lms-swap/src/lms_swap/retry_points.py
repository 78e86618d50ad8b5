"""Where forward waits for all its copies out: the points at which the caching allocator, in
the last forward of the same shape, had to release its cache while copies were still running.

A request that finds no free block large enough makes PyTorch's native caching allocator
release its cache and try again.  Before it releases anything it waits for the event of every
block whose copy still runs (``record_stream``), one by one, and then it unmaps its free pages,
which the allocations that follow map again.  Under forward's copies out, that stops the compute
stream until the last queued copy has run, and the unmapping and mapping come on top.  Profiled
on an H200 held to the H100's size (run 185), a Llama with every other layer checkpointed at
1.5x waited 0.43 s for 51 copy events (34 still running) in one allocation of its forward,
once a step, and its compute went on 0.14 s after the last of them; a UNet at 1.5x did the
same in a concatenation of its decoder.  Where the copies have run before the request, their blocks are free and merged
with their neighbours, and the request may be served from the cache.

So every reading of the allocation also reads the allocator's retry count (one
``memory_stats`` call gives both; :func:`~.device_memory.alloc_retries`).  A retry that came
while copies were in flight teaches the offset of the reading before it: the bytes forward had
saved then.  The next forward of that exact shape waits for all its copies at that offset
(:meth:`RetryPoints.due`, which the pacer asks at every saved tensor, where the tunable
``wait_at_retry_points`` is on), before the request comes.  A point where the wait did not
spare the retry is dropped for that shape for good, because waiting there costs overlap and
buys nothing.

Invariants: a point is learned only from a retry that came while copies were in flight, and only
forwards of the exact shape that taught it wait there (the points are kept per shape by
:mod:`.profiles` and never scaled to another).
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

from .state import DevState

__all__ = ["RetryPoints"]


class RetryPoints:
    """Learns and serves the points where forward waits for its copies, for the swapper that
    owns it: ``retries_of(index)`` is the allocator's retry count as of the last reading of
    device ``index`` (None where the allocator keeps none).  Counts in ``counts``: the
    allocator's releases seen in forward while copies ran (``retries_under_copies``), the
    points learned from them (``retry_points_learned``), those reached, where forward waited
    for whatever copies were still in flight (``retry_point_waits``), and those dropped
    (``retry_points_dropped``)."""

    def __init__(self, retries_of: Callable[[int], Optional[int]]) -> None:
        self._retries_of = retries_of
        self.reset()

    def reset(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def begin_forward(self, st: DevState) -> None:
        """A forward begins on ``st``: what the forward that ended learned joins its shape's
        points (before :mod:`.profiles` saves them under that shape), and this forward starts
        at its first point."""
        if st.retry_learned:
            dropped = set(st.drain_dropped or ())
            st.drain_at = sorted((set(st.drain_at or ()) | set(st.retry_learned)) - dropped)
        st.retry_learned = []
        st.drain_next = 0
        st.retry_mark = None
        st.drain_last = None

    def due(self, st: DevState) -> Optional[int]:
        """The point this forward has just reached (``st.saved`` bytes saved, the tensor
        being saved included), where it waits for all its copies; None where there is none.
        The caller waits, then takes a reading of the allocation, which :meth:`reading` ties
        to the point."""
        points = st.drain_at
        if not points or st.drain_next >= len(points) or st.saved < points[st.drain_next]:
            return None
        point = points[st.drain_next]
        while st.drain_next < len(points) and points[st.drain_next] <= st.saved:
            st.drain_next += 1
        st.drain_last = point
        self.counts["retry_point_waits"] += 1
        return point

    def reading(self, st: DevState, in_forward: bool) -> None:
        """A reading of the allocation of ``st``'s device was just taken (``st.saved``
        bytes saved so far): compares the allocator's retry count with the previous
        reading's and learns or drops a point."""
        retries = self._retries_of(st.index) if st.index is not None else None
        if retries is None or not in_forward:
            st.retry_mark = None
            return
        mark = st.retry_mark
        if mark is not None and retries > mark[2]:
            offset, busy, _, waited_at, swaps = mark
            # copies queued since the last reading; one may be the copy of the tensor whose
            # op made the request (queued after it), so only more than one says the
            # request came while copies ran
            if busy or st.swapped_in_fwd - swaps > 1:
                # copies were in flight between the two readings: wait for them at the
                # earlier one next time
                self.counts["retries_under_copies"] += 1
                if offset not in (st.drain_dropped or ()) and offset not in (st.drain_at or ()):
                    st.retry_learned.append(offset)
                    self.counts["retry_points_learned"] += 1
            elif waited_at is not None:
                # every copy had run, and the request still missed the cache
                st.drain_dropped = list(st.drain_dropped or ()) + [waited_at]
                st.drain_at = [p for p in (st.drain_at or ()) if p != waited_at]
                st.drain_next = sum(1 for p in st.drain_at if p <= st.saved)
                self.counts["retry_points_dropped"] += 1
        waited = st.drain_last
        if (waited is None and mark is not None and not mark[1]
                and st.swapped_in_fwd == mark[4]):
            waited = mark[3]  # nothing queued since the wait: still the wait's reading
        # copies in flight: the newest copy out has not run (they run in order on one stream;
        # the pacer forgets finished ones only when it next looks)
        busy = bool(st.inflight) and not st.inflight[-1][0].query()
        st.retry_mark = (st.saved, busy, retries, waited, st.swapped_in_fwd)
        st.drain_last = None

