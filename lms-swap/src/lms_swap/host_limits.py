"""The limits the host pool (:mod:`.host_pool`) grows under: its host memory limit, shared with
the eviction net's host copies; the floor of available memory it leaves the machine; the
allocator's shared host budget on a patched build.  Whether a size fits under them, and what
the error says when the pool cannot make room under one of them."""

from __future__ import annotations

from typing import Optional

from .environment import ENV_HOST_LIMIT, LMSHostMemoryError, fmt, host_available

__all__ = ["HostLimits"]


class HostLimits:
    """The host memory a pool may hold.

    ``limit`` bounds what the pool holds (bytes pinned, in use or not, and those given back
    and not yet unpinned) together with the host memory held elsewhere under the same limit
    (``extra_fn()``: the eviction net's host copies).  The pool also refuses to grow when the
    machine would be left with less than ``min_available`` bytes of available memory
    (``available_fn()``).  ``reserve_fn(n)->bool`` / ``release_fn(n)`` (the allocator's shared
    accounting on a patched build) are called when chunks are created and destroyed.
    """

    def __init__(self, limit: int, min_available: int = 0, reserve_fn=None, release_fn=None,
                 available_fn=host_available, extra_fn=None) -> None:
        if limit < 0:
            raise ValueError("host pool limit must be >= 0")
        self.limit = int(limit)
        self.min_available = int(min_available)
        self.reserve_fn = reserve_fn
        self.release_fn = release_fn
        self.available_fn = available_fn
        self.extra_fn = extra_fn      # host bytes held elsewhere under the same limit

    def held_elsewhere(self) -> Optional[int]:
        """The host bytes held elsewhere under the limit; None where nothing else shares it."""
        return self.extra_fn() if self.extra_fn is not None else None

    def over_limit(self, held: int, nbytes: int) -> bool:
        """Whether ``nbytes`` more than the pool's ``held`` would exceed the limit (shared
        with the eviction net's host copies)."""
        return held + (self.held_elsewhere() or 0) + nbytes > self.limit

    def machine_available(self) -> Optional[int]:
        """The machine's available memory, where the pool keeps a floor under it."""
        if self.min_available > 0 and self.available_fn is not None:
            return self.available_fn()
        return None

    def fits_now(self, held: int, nbytes: int) -> bool:
        """Whether ``nbytes`` more than the pool's ``held`` fit under the limit and the
        machine's floor as things are, nothing released."""
        avail = self.machine_available()
        return not self.over_limit(held, nbytes) and (
            avail is None or avail - nbytes >= self.min_available)

    def reserve(self, nbytes: int) -> bool:
        """Takes ``nbytes`` from the allocator's shared budget; True where there is none."""
        return self.reserve_fn is None or bool(self.reserve_fn(nbytes))

    def unreserve(self, nbytes: int) -> None:
        """Gives back to the allocator's shared budget what :meth:`reserve` took for a chunk
        that was not made."""
        if self.reserve_fn is not None and self.release_fn is not None:
            self.release_fn(nbytes)

    def released(self, nbytes: int) -> None:
        """Tells the allocator's shared budget that a chunk of ``nbytes`` is gone."""
        if self.release_fn is not None:
            self.release_fn(nbytes)

    # -- what the pool says when it cannot make room -----------------------------------------
    def limit_error(self, nbytes: int, in_use: int) -> LMSHostMemoryError:
        return LMSHostMemoryError(
            f"LMS: host swap space exhausted: {fmt(nbytes)} more would exceed "
            f"the host memory limit of {fmt(self.limit)} ({fmt(in_use)} in "
            f"use by swapped tensors). Raise {ENV_HOST_LIMIT} (MiB) or "
            f"host_limit=..., lower the batch size, or combine swapping with "
            f"torch.utils.checkpoint."
        )

    def floor_error(self, nbytes: int, avail: int, in_use: int) -> LMSHostMemoryError:
        return LMSHostMemoryError(
            f"LMS: host memory nearly exhausted: {fmt(nbytes)} more swap "
            f"space would leave {fmt(avail - nbytes)} available on this "
            f"machine (keeping at least {fmt(self.min_available)} free so the "
            f"OOM killer does not end the process); {fmt(in_use)} in use "
            f"by swapped tensors, limit {fmt(self.limit)}. Lower the batch "
            f"size or free host memory."
        )

    def budget_error(self, nbytes: int, reserved: int) -> LMSHostMemoryError:
        return LMSHostMemoryError(
            f"LMS: host memory limit shared with the CUDA allocator's LMS "
            f"reached: cannot reserve {fmt(nbytes)} more swap space "
            f"({fmt(reserved)} held by activation swapping). Raise "
            f"{ENV_HOST_LIMIT} (MiB) or lower the batch size."
        )
