"""The copies out and in: byte views of tensors, piecewise copies into and out of the host
pool's pieces, and the pacing of forward's copies out (forward waits for its oldest copies, so
that the memory they still hold leaves room for the next allocation)."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, List, Optional

import torch

from .policy import inflight_room
from .state import DevState

__all__ = ["CopyPacer", "plain_bytes", "flat_bytes", "copy_into_pieces", "copy_from_pieces"]


class CopyPacer:
    """How far forward's copies to the host may run behind it, for the swapper that owns it:
    ``config`` (its tunables), ``limit_of(st)`` and ``allocated_of(st)`` (the device limit it
    aims under and a reading of the allocation), ``pass_id()`` (the backward passes so far).
    Counts its waits in ``counts`` (``throttle_waits``, ``inflight_bounded``) and the time
    they took in ``throttle_s``."""

    def __init__(self, config: Any, limit_of: Callable[[DevState], int],
                 allocated_of: Callable[[DevState], int],
                 pass_id: Callable[[], int]) -> None:
        self.config = config
        self._limit_of = limit_of
        self._allocated_of = allocated_of
        self._pass_id = pass_id
        self.reset()

    def reset(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.throttle_s = 0.0

    def _allowance(self, st: DevState) -> int:
        return max(int(self.config.max_inflight_bytes), st.largest)

    def bound(self, st: DevState, nbytes: int) -> None:
        """Keeps the device memory of tensors waiting for their copy out, with the
        allocation, under the limit less room for the next allocation (the largest
        saved tensor): waits for the oldest copies first, as few as needed.  Checked at
        every tensor forward saves while copies run (``nbytes``: the bytes of it that
        are being copied out).

        A swapped tensor's memory cannot be reused until its copy has run, and
        ``memory_allocated`` no longer counts it once forward drops it.  Unbounded, the
        CPU, far ahead of the GPU, queued every copy of a forward at once, and when the
        caching allocator ran out it released its cache, which waits for every pending
        copy: the compute stream stood still until the last one had run (a UNet at 1.5x
        on the H100 queued 49 GB in 14 ms; 0.34 s of forward's compute then ran after
        all copies instead of beside them).  Waiting for the oldest copies only keeps
        compute and copies side by side."""
        if st.index is None:
            return
        self.drain(st, wait=False)
        if not st.inflight:
            return
        limit, largest = self._limit_of(st), st.largest
        seen = st.seen
        if seen is not None and seen[0] == self._pass_id() and st.saved >= seen[2]:
            # the last reading plus every byte saved since, and one more tensor (the
            # output of the op that saved this one, not saved yet), without a query
            # while that leaves room (memory_allocated builds the allocator's whole
            # statistics dictionary; an EfficientNet saves hundreds of tensors a step)
            est = seen[1] + st.saved - seen[2] + largest
            if st.inflight_bytes <= inflight_room(limit, largest, est, nbytes):
                return
        room = inflight_room(limit, largest, self._allocated_of(st), nbytes)
        if st.inflight_bytes > room:
            self.counts["inflight_bounded"] += 1
            self.drain(st, wait=True, allowance=max(nbytes, room))

    def drain(self, st: DevState, wait: bool, allowance: Optional[int] = None) -> None:
        """Forget finished device->host copies; with ``wait``, block until not more
        than the in-flight allowance is waiting."""
        if allowance is None:
            allowance = self._allowance(st)
        while st.inflight:
            ev, n = st.inflight[0]
            if not ev.query():
                if not wait or st.inflight_bytes <= allowance:
                    break
                t0 = time.perf_counter()
                ev.synchronize()
                self.throttle_s += time.perf_counter() - t0
                self.counts["throttle_waits"] += 1
            st.inflight.popleft()
            st.inflight_bytes -= n


def plain_bytes(t: torch.Tensor) -> bool:
    """Whether ``t``'s values are exactly the bytes of its storage that it spans, so that
    copying those bytes and back restores it bit for bit: a strided, non-nested,
    non-quantized tensor with real storage and no conjugate or negative bit (a
    ``conj()`` or ``_neg_view`` view holds other values than its bytes, a nested tensor has
    no single span, quantized ones carry their scale elsewhere).  Others stay on the
    device, as stock keeps them."""
    if t.layout != torch.strided or t.is_nested or t.is_quantized or t.is_meta:
        return False
    if t.is_conj() or t.is_neg():
        return False
    return True


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor whose elements fill their span of its storage densely
    (:func:`dense_span`: contiguous in some order of dimensions), as one flat uint8
    tensor, in storage order."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset()).view(torch.uint8)


def copy_into_pieces(pieces: List[torch.Tensor], src: torch.Tensor,
                     non_blocking: bool) -> None:
    """Copies the flat bytes ``src`` into the host pieces, in order."""
    off = 0
    for p in pieces:
        n = p.numel()
        p.copy_(src[off:off + n], non_blocking=non_blocking)
        off += n


def copy_from_pieces(dst: torch.Tensor, pieces: List[torch.Tensor],
                     non_blocking: bool) -> None:
    """Copies the host pieces, in order, into the flat bytes ``dst``."""
    off = 0
    for p in pieces:
        n = p.numel()
        dst[off:off + n].copy_(p, non_blocking=non_blocking)
        off += n
