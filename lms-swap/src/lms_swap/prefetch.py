"""Backward's copies in: a swapped tensor is fetched back to the device when backward unpacks
it, or ahead of that, in the reverse of the order forward swapped tensors out (the order
backward needs them in), on each device's host-to-device stream.

:class:`Prefetcher` is an object the swapper owns (as it owns its :class:`~.copies.CopyPacer`
and its :class:`~.forecast.StepForecast`): it is handed the swapper's tunables, the forecast
(the device limit and the headroom prefetching leaves), a reading of the device allocation
and the count of backward passes, and counts its copies in its own ``counts``.

It keeps two invariants.  Prefetching never fills the device past the limit less the
forecast's prefetch headroom, nor (under ``policy="auto"``) past forward's end, except up to
what the last backward of the same shape showed it may (past backward's peak,
:mod:`.backward_profile`).  And a fetched tensor's device memory is never reused under its
running copy: the stream it was allocated on waits for the copy before it uses or drops it."""

from __future__ import annotations

import collections
from typing import Any, Callable

import torch

from .copies import copy_from_pieces, flat_bytes
from .environment import OutOfMemoryError
from .state import DevState, Swapped

__all__ = ["Prefetcher"]


def _running_max(order: list) -> list:
    """Per position of the swap order, the largest swapped tensor at or below it."""
    out, top = [], 0
    for r in order:
        h = r()
        if h is not None and h.nbytes > top:
            top = h.nbytes
        out.append(top)
    return out


class Prefetcher:
    """Brings swapped tensors back for the swapper that owns it: ``config`` (its tunables),
    ``forecast`` (its :meth:`~.forecast.StepForecast.limit`,
    :meth:`~.forecast.StepForecast.prefetch_reserve` and
    :meth:`~.forecast.StepForecast.reserve_factor`), ``allocated_of(st)`` (a reading of the
    allocation) and ``pass_id()`` (the backward passes so far).  Counts its copies in
    ``counts`` (``in_count``, ``in_bytes``, ``prefetched``, ``prefetched_by_lesson``,
    ``prefetch_deferred``)."""

    def __init__(self, config: Any, forecast: Any, allocated_of: Callable[[DevState], int],
                 pass_id: Callable[[], int]) -> None:
        self.config = config
        self._forecast = forecast
        self._allocated_of = allocated_of
        self._pass_id = pass_id
        self.reset()

    def reset(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def begin_backward(self, st: DevState) -> None:
        """Backward begins on one device: nothing of the swap order consumed yet, and the
        largest swapped tensor at or below each of its positions."""
        st.cursor = len(st.order)
        st.order_max = _running_max(st.order)

    def fetch(self, st: DevState, h: Swapped) -> torch.Tensor:
        """Starts the copy of ``h`` back to the device (on the CPU: copies it at once) and
        returns the tensor it lands in."""
        if st.index is None:
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
            copy_from_pieces(flat_bytes(dst), h.host, non_blocking=False)
            h.gpu = dst
            self.counts["in_count"] += 1
            self.counts["in_bytes"] += h.nbytes
            return dst
        cur = torch.cuda.current_stream(h.device)
        try:
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
        except OutOfMemoryError:
            # copies still running hold memory that the allocator frees once they end
            torch.cuda.synchronize(h.device)
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
        # dst may reuse memory that work queued on `cur` still reads
        st.h2d.wait_stream(cur)
        if h.d2h_event is not None:
            st.h2d.wait_event(h.d2h_event)
        # a slot the net evicted: its bytes are in pageable memory, and the net's copy
        # had finished before it freed the device memory
        src = h.host if h.slot is None else [h.slot.host_bytes()]
        with torch.cuda.stream(st.h2d):
            copy_from_pieces(flat_bytes(dst), src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(st.h2d)
        # No dst.record_stream(st.h2d): the stream dst was allocated on waits for the
        # copy before it uses dst (the swapper's unpack) or drops it unused (its release), so
        # memory freed there is never reused under the copy.  Marked, every fetched tensor
        # left an event on the copy stream when it was freed, and the caching allocator,
        # before it releases its cache to serve a request, waits for all such events:
        # every prefetch queued behind it (on the H100, a UNet at 1.5x blocked 0.78 s at
        # backward's first convolution while the compute stream ran dry).
        h.gpu = dst
        h.gpu_stream = cur
        h.h2d_event = ev
        self.counts["in_count"] += 1
        self.counts["in_bytes"] += h.nbytes
        return dst

    def prefetch(self, st: DevState, start: int, device: torch.device) -> None:
        """Fetch the swapped tensors below position ``start`` of the pack order
        (backward needs them in about that order), at most ``prefetch_depth`` ahead and
        only while the device allocation stays under forward's end and under the limit
        less the forecast's prefetch reserve (the room backward needs for itself)."""
        depth = int(self.config.prefetch_depth)
        order = st.order
        j = min(start, len(order)) - 1
        count = 0
        free = None
        old_free = fetched = 0
        limit = self._forecast.limit(st)
        pass_id = self._pass_id()
        while j >= 0 and count < depth:
            c = order[j]()
            j -= 1
            if c is None or c.pass_id == pass_id or c.owner is None:
                continue
            if c.device != device:
                continue
            count += 1
            if c.gpu is not None:
                continue
            if free is None:
                ceiling = limit - self._forecast.prefetch_reserve(st)
                if st.fwd_end is not None and self.config.policy == "auto":
                    # never hold more than forward left: backward's peak over forward's
                    # end then measures backward's own need (the margin), not how far
                    # prefetching went (a margin that fed on its own prefetching stayed
                    # at 17 GB for a GPT-2 that needed less, on the H100)
                    ceiling = min(ceiling, st.fwd_end)
                alloc = self._allocated_of(st)
                free = old_free = ceiling - alloc
                if (self.config.policy == "auto" and self.config.prefetch_past_peak
                        and st.bwd.recording):
                    # past backward's peak, by what the last backward of this shape did
                    pos = min(start, len(st.order_max)) - 1
                    ahead = st.order_max[pos] if pos >= 0 else 0
                    room = st.bwd.room(st.bwd_lesson, limit, alloc,
                                       int(self._forecast.reserve_factor(st) * ahead))
                    if room is not None and room > free:
                        free = room
            if fetched + c.nbytes > free:
                self.counts["prefetch_deferred"] += 1
                break
            self.fetch(st, c)
            c.ahead = True
            st.bwd.prefetched(c.nbytes)
            fetched += c.nbytes
            self.counts["prefetched"] += 1
            if fetched > old_free:
                st.bwd.used = True
                self.counts["prefetched_by_lesson"] += 1
