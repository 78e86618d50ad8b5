"""Every host buffer lms_swap's host pool hands out for a CUDA swapper must be pinned.

Pageable host memory would still work (the copies would run through a staging buffer, at a
fraction of the speed, and synchronously), so nothing else in the suite would notice a pool that
stopped pinning. :func:`check_pool` wraps one pool's ``_hand_out`` (every range ``alloc`` and
``alloc_pieces`` return goes through it) and raises AssertionError on the first buffer that is not
pinned; :func:`check_cuda_swappers` does that for the pool of every swapper of device_type
"cuda" (the lms_swap conftest applies it to all GPU tests). ``is_pinned`` defaults to
``Tensor.is_pinned()`` (CUDA's cudaPointerGetAttributes: registered or page-locked memory reads
as host memory of CUDA's; pageable memory does not).
"""
from __future__ import annotations


def _default_is_pinned(t) -> bool:
    return bool(t.is_pinned())


def require_pinned(buf, is_pinned=None) -> None:
    if not (is_pinned or _default_is_pinned)(buf):
        raise AssertionError(
            f"lms_swap host buffer at 0x{buf.data_ptr():x} ({buf.numel() * buf.element_size()} bytes) "
            f"is not pinned: pageable memory handed out for swapping")


def check_pool(pool, is_pinned=None):
    """Checks every buffer ``pool`` hands out from now on; returns the pool. ``pool.pin_checks``
    counts the buffers checked."""
    if getattr(pool, "pin_checks", None) is not None:
        return pool
    hand_out = pool._hand_out
    pool.pin_checks = 0

    def checked(*args, **kw):
        buf = hand_out(*args, **kw)
        require_pinned(buf, is_pinned)
        pool.pin_checks += 1
        return buf

    pool._hand_out = checked
    return pool


def check_cuda_swappers(lms_swap, monkeypatch, is_pinned=None) -> None:
    """The pool of every ActivationSwapper of device_type "cuda" is checked (:func:`check_pool`)."""
    cls = lms_swap.ActivationSwapper
    prop = None
    for klass in cls.__mro__:
        if isinstance(klass.__dict__.get("pool"), property):
            prop = klass.__dict__["pool"]
            break
    assert prop is not None, "ActivationSwapper has no pool property"

    def pool(self):
        p = prop.fget(self)
        if self.config.device_type == "cuda":
            check_pool(p, is_pinned)
        return p

    monkeypatch.setattr(cls, "pool", property(pool))
