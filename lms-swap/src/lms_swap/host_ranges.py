"""The free ranges of the host pool's chunks (:mod:`.host_pool`): per chunk, its free ranges
by start and by end, neighbours always merged; across chunks, one index of every free range
by length, for best fit.  And the ranges handed back that wait for their last copy before
they are free again."""

from __future__ import annotations

import bisect
import collections
from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["Chunk", "CoolingRanges", "FreeRanges"]


class Chunk:
    """One pinned mapping.  ``starts``/``ends`` index its free ranges (start -> length,
    end -> start); ``ranges`` counts the ranges handed out and not yet free again (in use,
    or waiting for their last copy)."""

    __slots__ = ("id", "buf", "size", "starts", "ends", "ranges", "last_step", "last_time",
                 "offered")

    def __init__(self, cid: int, buf: torch.Tensor, step: int, now: float) -> None:
        self.id = cid
        self.buf = buf
        self.size = buf.numel()
        self.starts: Dict[int, int] = {}
        self.ends: Dict[int, int] = {}
        self.ranges = 0
        self.last_step = step
        self.last_time = now
        self.offered = False  # idle, and the eviction net's to give back until withdrawn


class FreeRanges:
    """Every free range of every chunk, as (length, chunk id, start), sorted: the smallest
    range that holds a request by bisection, the oldest chunk first among equal lengths."""

    def __init__(self) -> None:
        self._index: List[Tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._index)

    def largest(self) -> int:
        """The length of the largest free range (0 when none)."""
        return self._index[-1][0] if self._index else 0

    def smallest(self, need: int) -> Optional[Tuple[int, int]]:
        """(chunk id, start) of the smallest free range of at least ``need`` bytes."""
        i = bisect.bisect_left(self._index, (need, -1, -1))
        if i == len(self._index):
            return None
        _length, cid, start = self._index[i]
        return cid, start

    def add(self, chunk: Chunk, start: int, length: int) -> None:
        """A free range that has no free neighbour."""
        chunk.starts[start] = length
        chunk.ends[start + length] = start
        bisect.insort(self._index, (length, chunk.id, start))

    def drop(self, chunk: Chunk, start: int) -> int:
        """Takes the free range at ``start`` off the books; returns its length."""
        length = chunk.starts.pop(start)
        del chunk.ends[start + length]
        key = (length, chunk.id, start)
        i = bisect.bisect_left(self._index, key)
        assert self._index[i] == key, "host pool free index out of sync"
        del self._index[i]
        return length

    def merge(self, chunk: Chunk, start: int, length: int) -> None:
        """A range that became free, merged with its free neighbours."""
        prev = chunk.ends.get(start)
        if prev is not None:
            length += self.drop(chunk, prev)
            start = prev
        if start + length in chunk.starts:
            length += self.drop(chunk, start + length)
        self.add(chunk, start, length)


class CoolingRanges:
    """Ranges handed back whose last copy may still run, in the order they came back: each is
    free again only once its copy's event (if any) completed, so the next tensor's copy never
    meets one still reading or writing it."""

    def __init__(self) -> None:
        self._q: "collections.deque" = collections.deque()  # (chunk, start, length, event)

    def __bool__(self) -> bool:
        return bool(self._q)

    def add(self, chunk: Chunk, start: int, length: int, event) -> None:
        self._q.append((chunk, start, length, event))

    def reclaim(self, how: str, put_back) -> None:
        """Hands ``put_back(chunk, start, length)`` the ranges whose last copy finished:
        ``"front"`` those at the head of the queue, ``"poll"`` all that finished, ``"wait"``
        all (waiting for their copies)."""
        q = self._q
        if how == "front":
            while q and (q[0][3] is None or q[0][3].query()):
                put_back(*q.popleft()[:3])
            return
        keep = collections.deque()
        while q:
            chunk, start, length, ev = q.popleft()
            if ev is not None and how == "poll" and not ev.query():
                keep.append((chunk, start, length, ev))
                continue
            if ev is not None and how == "wait":
                ev.synchronize()
            put_back(chunk, start, length)
        self._q = keep
