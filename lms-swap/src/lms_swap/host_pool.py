"""The pinned host pool that swapped tensors live in: pinned chunks, carved into ranges
of any size."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch

from .environment import MiB, LMSHostMemoryError, fmt, host_available
from .host_keep import ChunkKeeping
from .host_limits import HostLimits
from .host_ranges import Chunk as _Chunk, CoolingRanges, FreeRanges
from .pinned import PAGE, map_host, releaser

__all__ = ["HostPool"]

_ALIGN = 4096       # every range starts on a 4 KiB boundary
_HUGE = 2 * MiB     # chunks are whole huge pages where the kernel has them
_MIN_PIECE = 2 * MiB  # a tensor is not split into pieces smaller than this
_chunk_ids = itertools.count(1)  # process-wide: the eviction net knows chunks by id


def _round_up(n: int, a: int) -> int:
    return (int(n) + a - 1) // a * a


class HostPool:
    """Pinned host memory for swapped tensors, under a host memory limit.

    The pool pins host memory in chunks (``chunk_bytes``, or one request's size when it
    is larger) and hands out ranges of them of any size, best fit, merging neighbours
    when they come back; :meth:`alloc_pieces` serves one tensor from several ranges
    when no single one is large enough.  A training step does not always swap the same
    tensors: on the H100 an EfficientNet's first step swapped under pressure late in
    forward (186 tensors of 0.2 GB on average) and its second step, by the plan, 27
    activations of 1.4 GB from forward's start; pools of exact-size buffers, and then
    of ranges that could not span chunks, pinned 41 GB more for the second step and
    gave the first step's memory back during the timed steps (0.3-0.5 s a step for
    8-11 steps).  Variable sequence lengths change every size each step.  With pieces
    any mix of sizes is served from what was pinned: the pool grows only when the bytes
    in use do.  (Not ``torch.empty(..., pin_memory=True)``: PyTorch's caching host
    allocator rounds every request up to a power of two and keeps what it got, up to
    twice the memory.)  With ``pin=False`` (CPU-only machines, tests) the chunks are
    plain host memory and all accounting works the same.

    ``limit`` bounds :attr:`reserved` (bytes pinned, in use or not), ``min_available``
    keeps a floor of the machine's available memory, and ``reserve_fn`` / ``release_fn``
    are the allocator's shared budget on a patched build (:class:`~.host_limits.HostLimits`).
    Growing past one of them first releases chunks nothing is carved from; when that is
    not enough :class:`LMSHostMemoryError` is raised.  A chunk is given back only whole, so
    free bytes scattered over chunks that still hold a swapped tensor stay pinned; the
    chunk size bounds that waste per chunk.

    Between training steps (:meth:`end_step`) the pool gives back the chunks nothing was
    carved from in the last ``keep_steps`` steps nor in the last ``keep_seconds``, which
    grows when a need it gave back comes again (:class:`~.host_keep.ChunkKeeping`).

    Unused chunks yield to the limit at once: when the eviction net's host copies
    (``extra_fn``) and what the pool holds exceed it, the next pool operation releases
    them, least recently used first.
    The net counts every byte the pool holds (``on_change`` reports :attr:`reserved`)
    and cannot wait for Python, so the pool offers it each chunk the moment nothing is
    carved from it (``net.offer``): when the net's copies would go over the limit it
    unpins such chunks and returns their pages itself, and the pool drops them from its
    books at its next operation (``net.take_discarded``).  Before it carves from an idle
    chunk or releases it the pool withdraws the offer (``net.withdraw``; False: the net
    already gave it back).  Host memory then stays under the limit at all times, an idle
    pool never makes the net refuse, and the machine's ``min_available`` floor holds for
    both.  (Counting only the bytes in use, the net once took 29.9 GiB while the pool
    held idle chunks, and a ResNet-50 at 2.0x went 12 GiB over its limit.)  Chunks given
    back are unpinned and unmapped on a daemon thread (:mod:`.pinned`); until they are
    gone they count against the limit and the floor, the net's included.
    """

    def __init__(
        self,
        limit: int,
        pin: bool = True,
        min_available: int = 0,
        reserve_fn=None,
        release_fn=None,
        available_fn=host_available,
        extra_fn=None,
        on_change=None,
        net=None,
        keep_steps: int = 8,
        chunk_bytes: int = 256 * MiB,
        keep_seconds: float = 30.0,
        max_keep_seconds: float = 600.0,
        clock=time.monotonic,
    ) -> None:
        self._limits = HostLimits(limit, min_available, reserve_fn, release_fn,
                                  available_fn, extra_fn)
        self._keep = ChunkKeeping(keep_steps, keep_seconds, max_keep_seconds, clock)
        if chunk_bytes <= 0:
            raise ValueError("host pool chunk_bytes must be > 0")
        self.pin = bool(pin)
        self._on_change = on_change    # called with `reserved` when it changes
        self._net = net                # offer / withdraw / take_discarded (the eviction net)
        self.chunk_bytes = _round_up(chunk_bytes, PAGE)
        self._lock = threading.RLock()
        self._chunks: Dict[int, _Chunk] = {}
        self._free = FreeRanges()
        self._live: Dict[int, Tuple[_Chunk, int, int]] = {}  # data_ptr -> chunk, start, length
        self._cooling = CoolingRanges()  # ranges returned whose last copy may still run
        self._pending: List[tuple] = []
        self._busy = False
        self.reserved = 0
        self.in_use = 0
        self.peak_in_use = 0
        self.peak_reserved = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.net_discards = 0          # idle chunks the eviction net gave back
        self.blocks = 0
        self.pin_seconds = 0.0
        self._device: Optional[int] = None  # where the chunks were pinned

    # -- public --------------------------------------------------------------------
    @property
    def limit(self) -> int:
        """The host memory limit the pool holds under (settable)."""
        return self._limits.limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limits.limit = value

    @property
    def min_available(self) -> int:
        """The machine's available memory the pool leaves (settable)."""
        return self._limits.min_available

    @min_available.setter
    def min_available(self, value: int) -> None:
        self._limits.min_available = value

    @property
    def keep_steps(self) -> int:
        return self._keep.keep_steps

    @property
    def keep_seconds(self) -> float:
        return self._keep.keep_seconds

    @property
    def max_keep_seconds(self) -> float:
        return self._keep.max_keep_seconds

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A uint8 host tensor of exactly ``nbytes`` bytes (pinned when ``pin``), one
        range of one chunk."""
        return self._take(nbytes, split=False)[0]

    def alloc_pieces(self, nbytes: int) -> List[torch.Tensor]:
        """Host tensors (uint8, pinned when ``pin``) whose sizes add up to ``nbytes``:
        one range where one fits, else the largest free ranges and what a last range or
        a new chunk adds.  A tensor swapped in pieces needs no range of its own size:
        an EfficientNet's planned swaps of 1.4 GB activations found only the 256 MiB
        chunks its first step had pinned for smaller ones, and the pool pinned 40 GB
        more.  Pieces are at least 2 MiB (one copy each)."""
        return self._take(nbytes, split=True)

    def free(self, buf: torch.Tensor, event=None) -> None:
        """Return ``buf``; its range is handed out again once ``event`` (if any)
        completed.

        Safe to call from ``__del__`` at any time (also while this thread is inside
        the pool, e.g. when the garbage collector runs): the buffer is queued and
        taken back at the next pool operation."""
        self._pending.append((buf, event))  # list.append is atomic
        if self._lock.acquire(blocking=False):
            try:
                if not self._busy:
                    self._flush()
            finally:
                self._lock.release()

    def empty_cache(self, wait: bool = True) -> int:
        """Release every chunk nothing is carved from (given back once ``wait``
        returns); returns the bytes released."""
        released = 0
        with self._lock:
            self._flush()
            with self._deferring_frees():
                self._collect()
                self._reclaim("wait")
                for c in self._idle_chunks():
                    released += self._release_chunk(c)
        if wait:
            releaser.wait()
        return released

    @staticmethod
    def wait_released() -> None:
        """Returns once every chunk the pools gave back is unpinned and unmapped."""
        releaser.wait()

    def end_step(self) -> int:
        """Called between training steps: gives back the chunks nothing was carved from
        in the last ``keep_steps`` steps nor in the last ``keep_seconds``.  Returns the
        bytes released."""
        released = 0
        with self._lock:
            self._flush()
            oldest, now = self._keep.step_end()  # chunks last used before `oldest` go
            with self._deferring_frees():
                self._collect()
                self._reclaim("poll")
                for c in self._idle_chunks():
                    if c.last_step >= oldest:
                        break
                    if self._keep.idle_too_long(c, now):
                        released += self._release_chunk(c)
                        self._keep.gave_back(c)
            released += self._trim_to_limit()
        return released

    def __del__(self) -> None:
        # unpin what the pool still holds: pages unmapped while registered would make
        # a later cudaHostRegister of a mapping at the same address fail
        try:
            self.empty_cache(wait=False)
        except Exception:
            pass

    @property
    def cached(self) -> int:
        """Bytes pinned and not holding a swapped tensor."""
        with self._lock:
            if not self._busy:
                self._flush()
            return self.reserved - self.in_use

    def stats(self) -> Dict[str, int]:
        with self._lock:
            if not self._busy:
                self._flush()
                self._collect()
            return {
                "host.limit_bytes": self.limit,
                "host.reserved_bytes": self.reserved,
                "host.in_use_bytes": self.in_use,
                "host.cached_bytes": self.reserved - self.in_use,
                "host.peak_in_use_bytes": self.peak_in_use,
                "host.peak_reserved_bytes": self.peak_reserved,
                "host.blocks": self.blocks,
                "host.free_ranges": len(self._free),
                "host.largest_free_bytes": self._free.largest(),
                "host.pool_hits": self.hits,
                "host.pool_misses": self.misses,
                "host.evictions": self.evictions,
                "host.net_discards": self.net_discards,
                "host.pin_ms": int(self.pin_seconds * 1000),
                "host.keep_ms": int(self.keep_seconds * 1000),
                "host.releasing_bytes": releaser.pending,
                "host.release_errors": releaser.errors,
            }

    def reset_peaks(self) -> None:
        with self._lock:
            self.peak_in_use = self.in_use
            self.peak_reserved = self.reserved

    # -- returned buffers --------------------------------------------------------------
    @contextlib.contextmanager
    def _deferring_frees(self):
        """While the ranges change (the lock held): a buffer returned meanwhile, by a
        ``__del__`` the garbage collector runs on this thread, waits in ``_pending``
        for the next flush instead of entering the ranges mid-change."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    def _flush(self) -> None:
        if not self._pending:
            return
        with self._deferring_frees():
            while self._pending:
                buf, event = self._pending.pop()
                ent = self._live.pop(buf.data_ptr(), None)
                if ent is None:  # pragma: no cover - not a buffer of this pool
                    continue
                chunk, start, length = ent
                self.in_use -= buf.numel()
                self._touch(chunk)
                self._cooling.add(chunk, start, length, event)
            self._reclaim("front")
        self._changed()
        self._trim_to_limit()

    def _reclaim(self, how: str) -> None:
        """Makes returned ranges free again once their last copy finished
        (:meth:`~.host_ranges.CoolingRanges.reclaim`: ``"front"``, ``"poll"`` or ``"wait"``)."""
        self._cooling.reclaim(how, self._put_back)

    # -- ranges --------------------------------------------------------------------
    def _take(self, nbytes: int, split: bool) -> List[torch.Tensor]:
        """Ranges that hold ``nbytes``, handed out as tensors: the best-fitting one, else
        (``split``) the largest free ranges of at least 2 MiB first; what they lack
        comes from a new chunk.  A request that fails leaves every range as it was."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError("HostPool.alloc: nbytes must be > 0")
        need = _round_up(nbytes, _ALIGN)
        taken: List[Tuple[_Chunk, int, int]] = []
        with self._lock:
            self._flush()
            with self._deferring_frees():
                self._collect()
                misses = self.misses
                try:
                    left = need
                    got = self._carve(left)  # (waits for cooling ranges before failing)
                    while got is None:
                        largest = self._free.largest()
                        if split and largest >= _MIN_PIECE:
                            got = self._best_fit(largest)  # the whole largest range
                            taken.append((got[0], got[1], largest))
                            left -= largest
                        else:
                            self._grow(left)
                            self.misses += 1
                        got = self._best_fit(left)
                    taken.append((got[0], got[1], left))
                except BaseException:
                    for chunk, start, length in taken:  # nothing was handed out
                        self._put_back(chunk, start, length)
                    raise
                if self.misses == misses:
                    self.hits += 1
            bufs, off = [], 0
            for chunk, start, length in taken:
                n = min(length, nbytes - off)
                bufs.append(self._hand_out(chunk, start, length, n))
                off += n
            self._changed()
            return bufs

    def _hand_out(self, chunk: _Chunk, start: int, length: int, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of a range carved by :meth:`_best_fit`, as a tensor."""
        buf = chunk.buf[start:start + nbytes]
        self._live[buf.data_ptr()] = (chunk, start, length)
        self._touch(chunk)
        self.in_use += nbytes
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return buf

    def _carve(self, need: int) -> Optional[Tuple[_Chunk, int]]:
        """The best-fitting free range of at least ``need`` bytes, split off; before
        giving up, the ranges still waiting for their copies (waited for, last)."""
        got = self._best_fit(need)
        if got is None and self._cooling:
            self._reclaim("poll")
            got = self._best_fit(need)
            if got is None and self._cooling:
                self._reclaim("wait")
                got = self._best_fit(need)
        return got

    def _best_fit(self, need: int) -> Optional[Tuple[_Chunk, int]]:
        """Carves ``need`` bytes from the smallest free range that has them (the chunk
        then counts the range as handed out: it is not idle)."""
        while True:
            found = self._free.smallest(need)
            if found is None:
                return None
            cid, start = found
            chunk = self._chunks[cid]
            if not chunk.offered or self._withdraw(chunk):
                break
            self._forget(chunk)  # the net gave it back meanwhile
        length = self._free.drop(chunk, start)
        if length > need:  # the rest stays free (its right neighbour is in use)
            self._free.add(chunk, start + need, length - need)
        chunk.ranges += 1
        return chunk, start

    def _put_back(self, chunk: _Chunk, start: int, length: int) -> None:
        """A returned range is free: merged with free neighbours."""
        self._free.merge(chunk, start, length)
        chunk.ranges -= 1
        if chunk.ranges == 0:
            self._offer(chunk)

    # -- chunks --------------------------------------------------------------------
    def _touch(self, chunk: _Chunk) -> None:
        self._keep.touch(chunk)

    def _idle_chunks(self) -> List[_Chunk]:
        """Chunks nothing is carved from, least recently used first."""
        return sorted((c for c in self._chunks.values() if c.ranges == 0),
                      key=lambda c: (c.last_step, c.id))

    def _release_chunk(self, chunk: _Chunk) -> int:
        if chunk.offered and not self._withdraw(chunk):
            self._forget(chunk)  # the net gave it back already
            return chunk.size
        self._unbook(chunk)
        self.evictions += 1
        releaser.put(chunk.buf, None, self._device if self.pin else None,
                     self._limits.release_fn)
        self._changed()
        return chunk.size

    def _trim_to_limit(self) -> int:
        """Releases idle chunks, least recently used first, while what the pool holds and
        the host memory held elsewhere under the same limit exceed it."""
        extra = self._limits.held_elsewhere()
        if extra is None:
            return 0
        if self.reserved + extra <= self.limit:
            return 0
        released = 0
        with self._deferring_frees():
            for c in self._idle_chunks():
                if self.reserved + extra <= self.limit:
                    break
                released += self._release_chunk(c)
        return released

    def _held(self) -> int:
        """Bytes held under the limit: the pool's, and those it gave back that are not
        yet unpinned and unmapped."""
        return self.reserved + releaser.pending

    def _give_way(self) -> bool:
        """Makes host room: releases the least recently used idle chunk, else frees the
        ranges waiting for their copies, else waits for the chunks being given back.
        False when there is none of these."""
        idle = self._idle_chunks()
        if idle:
            self._release_chunk(idle[0])
        elif self._cooling:
            self._reclaim("wait")
        elif releaser.pending:
            releaser.wait()
        else:
            return False
        return True

    def _grow(self, need: int) -> None:
        """A new chunk for a request of ``need`` bytes that no free range fits: of
        ``chunk_bytes`` (whole huge pages for a larger request), or of the request's
        size alone when the limits leave no room for more."""
        want = _round_up(max(_round_up(need, _HUGE), self.chunk_bytes), PAGE)
        exact = _round_up(need, PAGE)
        # never release chunks for room beyond the need
        if not self._limits.fits_now(self._held(), want):
            want = exact
        try:
            self._make_room(want)
        except LMSHostMemoryError:
            if want == exact:
                raise
            want = exact
            self._make_room(want)
        self._create(want)

    def _make_room(self, nbytes: int) -> None:
        lim = self._limits
        # 1. our own limit (shared with the eviction net's host copies)
        while lim.over_limit(self._held(), nbytes):
            if not self._give_way():
                raise lim.limit_error(nbytes, self.in_use)
        # 2. the machine
        avail = lim.machine_available()
        while avail is not None and avail - nbytes < lim.min_available:
            if not self._give_way():
                raise lim.floor_error(nbytes, avail, self.in_use)
            avail = lim.machine_available()
        # 3. the allocator's shared budget (patched build)
        while not lim.reserve(nbytes):
            if not self._give_way():
                raise lim.budget_error(nbytes, self.reserved)

    def _create(self, length: int) -> None:
        """Maps (and pins) a chunk of ``length`` bytes, a multiple of the page size, its
        room already made; the whole chunk is one free range."""
        t0 = time.perf_counter()
        if self._on_change is not None:
            self._on_change(self.reserved + length)  # the net counts the pages first
        try:
            if self.pin and self._device is None:
                self._device = torch.cuda.current_device()
            try:
                buf = map_host(length, self.pin)
            except (OSError, ValueError) as e:
                raise LMSHostMemoryError(
                    f"LMS: cannot map {fmt(length)} of host memory for swap space ({e}); "
                    f"{fmt(self.reserved)} already held") from None
            except RuntimeError as e:
                raise LMSHostMemoryError(
                    f"LMS: pinning {fmt(length)} of host memory failed ({e}); "
                    f"{fmt(self.reserved)} already pinned for swapping.") from None
        except BaseException:
            self._limits.unreserve(length)
            self._changed()
            raise
        if self.pin:
            self.pin_seconds += time.perf_counter() - t0
        now = self._keep.now()
        self._keep.pinned_again(now)  # the need end_step gave back came again
        chunk = _Chunk(next(_chunk_ids), buf, self._keep.step, now)
        self._chunks[chunk.id] = chunk
        self._free.add(chunk, 0, length)
        self.reserved += length
        self.blocks += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._changed()

    def _unbook(self, chunk: _Chunk) -> None:
        """Takes an idle chunk (one free range, the whole of it) out of the books."""
        self._free.drop(chunk, 0)
        del self._chunks[chunk.id]
        self.reserved -= chunk.size
        self.blocks -= 1

    # -- the eviction net's share of idle chunks ------------------------------------------
    def _offer(self, chunk: _Chunk) -> None:
        """A chunk whose last range came back (nothing carved, no copy pending) becomes
        the net's to give back.  (Not a new one: the request that grew it carves from it
        at once.)"""
        if self._net is not None and not chunk.offered:
            chunk.offered = True
            self._net.offer(chunk.id, chunk.buf.data_ptr(), chunk.size,
                            self._device if self.pin else -1)

    def _withdraw(self, chunk: _Chunk) -> bool:
        """The offer taken back before the pool uses the chunk; False: the net gave it back."""
        chunk.offered = False
        return bool(self._net.withdraw(chunk.id))

    def _forget(self, chunk: _Chunk) -> None:
        """Drops a chunk the net gave back (already unpinned, its pages returned)."""
        chunk.offered = False
        self._unbook(chunk)
        self.net_discards += 1
        self._limits.released(chunk.size)
        chunk.buf = None  # the last reference: the mapping goes
        self._changed()

    def _collect(self) -> None:
        """Drops the chunks the net gave back since the last call."""
        if self._net is None:
            return
        for cid in self._net.take_discarded():
            chunk = self._chunks.get(cid)
            if chunk is not None and chunk.offered:
                self._forget(chunk)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.reserved)
