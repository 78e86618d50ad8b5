"""When a swapper computes ``F.cross_entropy`` in blocks (:mod:`.chunked_loss`) instead of
stock's kernel, and which loss input it sends to host memory whatever its plan says, so that
the chunked backward can write the input's gradient over the copy that comes back.

The chunking ``F.cross_entropy`` is in place while any swapper is entered, in any thread; a
call is chunked only in a thread that entered one (:meth:`LossChunking.decide`)."""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any, Callable

import torch

from .chunked_loss import MIN_BYTES, LossPatch
from .state import DevState

__all__ = ["LossChunking"]

_LOSS = LossPatch()  # F.cross_entropy while any swapper is entered (chunked_loss)
_LOSS_LOCK = threading.Lock()


class LossChunking:
    """Which ``F.cross_entropy`` calls the swapper that owns it runs in blocks: ``config``
    (its tunables), ``tls`` (its per-thread state, whose ``hooks`` are the hooks a thread
    entered), ``lock`` (its lock), ``state_of(t)``, ``allocated_of(st)`` and ``guard()``
    (a tensor's device state, a reading of the allocation, the eviction net or None) and
    ``cap_of(st)`` (the forecast's bound on what the caching allocator can have).  Counts
    in ``counts`` (``chunked_losses``, ``loss_inputs_to_host``)."""

    def __init__(self, config: Any, tls: threading.local, lock: Any,
                 state_of: Callable[[torch.Tensor], DevState],
                 allocated_of: Callable[[DevState], int], guard: Callable[[], Any],
                 cap_of: Callable[[DevState], int]) -> None:
        self.config = config
        self._tls = tls
        self._lock = lock
        self._state_of = state_of
        self._allocated_of = allocated_of
        self._guard = guard
        self._cap_of = cap_of
        self._pending = threading.local()  # per thread: the loss input bound for the host
        self.reset()

    def reset(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def enter(self) -> None:
        """The owner was entered: the chunking ``F.cross_entropy`` is in place until every
        swapper that entered it has left."""
        with _LOSS_LOCK:
            _LOSS.enter(self.decide)

    def exit(self) -> None:
        with _LOSS_LOCK:
            _LOSS.exit()

    def decide(self, x: torch.Tensor) -> bool:
        """Whether ``F.cross_entropy`` over ``x`` runs in blocks (:mod:`.chunked_loss`):
        only in a thread that swaps, for inputs of at least MIN_BYTES, and under
        ``chunked_loss="auto"`` only where stock's loss could not fit: stock keeps a
        log-softmax of the input's size, and its backward holds that, the incoming
        gradient and its result at once while the input and the tensor it was upcast
        from (half its size) are gone; so the allocation now and one and a half more
        tensors of the input's size, less what this forward kept on the device that the
        net can move, over what the caching allocator can have.  (With two, or without
        counting what the net can move, an H100 chunked the loss of a checkpointed Llama
        at the batch stock trains: its checkpoints' inputs, 13.5 GiB, were on the
        device.)  Where even the chunked loss's backward could not hold its input and
        that input's gradient at once (the allocation now plus half a tensor more), the
        input is swapped whatever the plan says, and its gradient is written over the copy
        that comes back (a Llama at twice stock's batch ran out of memory there)."""
        mode = self.config.chunked_loss
        size = x.numel() * x.element_size()
        if mode is False or mode == 0 or not getattr(self._tls, "hooks", None) or size < MIN_BYTES:
            return False
        if x.device.type == "cuda" and self.config.policy != "never":
            with self._lock:
                st = self._state_of(x)
                now = self._allocated_of(st)
                if self._guard() is not None:
                    # what this forward kept on the device, the net moves if backward
                    # needs the room
                    now -= st.kept_movable
                cap = self._cap_of(st)
                if mode == "auto" and now + 3 * size // 2 <= cap:
                    return False
                if now + size // 2 > cap:
                    # backward could not hold the input and its gradient side by side:
                    # the input goes to host memory, comes back as a tensor nobody else
                    # holds, and its gradient is written over it (see chunked_loss)
                    self._pending.loss_input = weakref.ref(x)
        elif mode == "auto":
            return False
        self.counts["chunked_losses"] += 1
        return True

    def takes_input(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is the input of a chunked loss that must go to host memory
        (:meth:`decide`); counts it and forgets it once seen."""
        ref = getattr(self._pending, "loss_input", None)
        if ref is None or ref() is not t:
            return False
        self._pending.loss_input = None
        self.counts["loss_inputs_to_host"] += 1
        return True
