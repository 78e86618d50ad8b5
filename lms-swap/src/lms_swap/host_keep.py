"""How long the host pool (:mod:`.host_pool`) keeps an idle chunk pinned between training
steps: the steps and seconds since anything was carved from it, and the time to keep that
grows when a need the pool gave back comes again."""

from __future__ import annotations

import time
from typing import Optional, Tuple

from .host_ranges import Chunk

__all__ = ["ChunkKeeping"]


class ChunkKeeping:
    """The steps and the clock the host pool's chunks are stamped with, and which idle chunks
    it gives back at a step's end.

    Between training steps the pool gives back the chunks nothing was carved from in the
    last ``keep_steps`` steps nor in the last ``keep_seconds``: host memory follows need,
    and what any recent step used stays pinned.  Pinning runs at 3-4 GB/s (on the H100
    machine), and a step's need varies: a Llama at 1.5x swapped its 6.6 GiB fp32 logits in
    two steps of every four; a pool capped at the most one step had in use gave that memory
    back and pinned it again every cycle (4 s in a 1.7 s step).  A loop with an evaluation
    pass every 10 steps that swapped 17 GB more than its training steps lost those chunks
    after 8 steps and spent 2.5-4 s pinning them again in each pass.  When the pool pins
    again after giving chunks back, the need recurred: ``keep_seconds`` grows to twice the
    time from those chunks' last use to now (at most ``max_keep_seconds``), so a need that
    comes back every period keeps its chunks from then on.
    """

    def __init__(self, keep_steps: int = 8, keep_seconds: float = 30.0,
                 max_keep_seconds: float = 600.0, clock=time.monotonic) -> None:
        if keep_steps < 1:
            raise ValueError("host pool keep_steps must be >= 1")
        if not 0 <= keep_seconds <= max_keep_seconds:
            raise ValueError("host pool keep_seconds must be in [0, max_keep_seconds]")
        self.keep_steps = int(keep_steps)
        self.keep_seconds = float(keep_seconds)
        self.max_keep_seconds = float(max_keep_seconds)
        self._clock = clock
        self._gave_back_use: Optional[float] = None  # last use of what step_end gave back
        self.step = 0                 # step_end() calls so far

    def now(self) -> float:
        return self._clock()

    def touch(self, chunk: Chunk) -> None:
        """A chunk used now: in this step, at this time."""
        chunk.last_step = self.step
        chunk.last_time = self._clock()

    def step_end(self) -> Tuple[int, float]:
        """A step ended: (the oldest step whose use keeps a chunk, now)."""
        self.step += 1
        return self.step - self.keep_steps, self._clock()

    def idle_too_long(self, chunk: Chunk, now: float) -> bool:
        """Whether nothing was carved from ``chunk`` in the last ``keep_seconds``."""
        return now - chunk.last_time >= self.keep_seconds

    def gave_back(self, chunk: Chunk) -> None:
        """``chunk`` was given back at a step's end: a chunk pinned later meets that need
        again (:meth:`pinned_again`)."""
        self._gave_back_use = max(self._gave_back_use or chunk.last_time, chunk.last_time)

    def pinned_again(self, now: float) -> None:
        """The pool pinned a chunk at ``now``: where it gave chunks back before, the need
        came again, and ``keep_seconds`` grows to twice the time since their last use."""
        if self._gave_back_use is not None:
            self.keep_seconds = min(self.max_keep_seconds,
                                    max(self.keep_seconds, 2 * (now - self._gave_back_use)))
            self._gave_back_use = None
