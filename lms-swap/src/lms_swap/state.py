"""What the swapper keeps per swapped tensor (the handle autograd holds) and per device
(what the current step has seen and what earlier steps taught)."""

from __future__ import annotations

import collections
import weakref
from typing import Any, List, Optional

import torch

from .backward_profile import BackwardLesson, BackwardProfile
from .profiles import ShapeProfiles

__all__ = ["DevState", "Swapped", "check_version"]


class Swapped:
    """What autograd holds for a swapped tensor (the packed object)."""

    __slots__ = (
        "owner", "nbytes", "size", "stride", "dtype", "device", "host",
        "d2h_event", "gpu", "gpu_stream", "h2d_event", "refs", "unpacks", "index",
        "version_of", "version", "pass_id", "slot", "offset", "ahead", "__weakref__",
    )

    @classmethod
    def of(cls, owner: Any, t: torch.Tensor, nbytes: int,
           host: Optional[List[torch.Tensor]] = None, slot: Any = None) -> "Swapped":
        """The handle of ``t``: swapped to ``host`` (the pool's pieces that hold its
        bytes, in order), or kept on the device in ``slot``."""
        h = cls()
        h.owner = owner  # from here on, dropping h returns the host buffer (owner.release_handle)
        h.host, h.slot = host, slot
        h.nbytes = nbytes
        h.size, h.stride, h.dtype, h.device = t.size(), t.stride(), t.dtype, t.device
        h.d2h_event = h.gpu = h.gpu_stream = h.h2d_event = None
        h.refs, h.unpacks, h.pass_id, h.index = 1, 0, -1, None
        h.offset = None   # bytes its forward had saved before it (swapped tensors)
        h.ahead = False   # fetched by prefetching and not yet unpacked
        h.version = t._version
        h.version_of = _version_alias(t)
        return h

    def __del__(self) -> None:
        owner = self.owner
        if owner is not None and (self.host is not None or self.gpu is not None):
            try:
                owner.release_handle(self)
            except Exception:
                pass


def _version_alias(t: torch.Tensor) -> Any:
    """Something that reads ``t``'s version counter for as long as autograd holds the
    saved tensor, without holding its memory: an alias of ``t`` (``detach()`` shares the
    version counter, which views of one base share too) moved onto an empty storage,
    with the counter put back where it was.  An in-place change of ``t``, of its base or
    of any view of them after the save then shows, also when no Python object of ``t``
    is left.  Falls back to a weak reference to ``t`` (checked while ``t`` is alive)
    where this PyTorch cannot move an alias's storage."""
    setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
    if setter is None:  # (PyTorch 1.x)
        return weakref.ref(t)
    try:
        version = t._version
        alias = t.detach()
    except Exception:
        return weakref.ref(t)
    with torch.no_grad():
        alias.set_()
    if alias._version != version:  # set_() counts as an in-place change of the alias
        try:
            setter((alias,), (version,))
        except TypeError:  # (the signature before PyTorch 2.5: one tensor, one version)
            setter(alias, version)
    return alias


def check_version(h: "Swapped") -> None:
    """Stock autograd's check that a saved tensor was not changed in place since it
    was saved (autograd cannot see it through a handle)."""
    alias = h.version_of
    if isinstance(alias, weakref.ref):
        alias = alias()
        if alias is None:
            return
    now = alias._version
    if now != h.version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified "
            f"by an inplace operation: [{h.dtype} {list(h.size)}] is at version "
            f"{now}; expected version {h.version} instead (the tensor was "
            "saved through LMS activation swapping)."
        )


class DevState:
    """One device's state: its copy streams and in-flight copies, the swap order of the
    current step, what this forward has done so far, and what earlier steps taught
    (limit, margin, plan, prefetch headroom)."""

    __slots__ = (
        "index", "d2h", "h2d", "est", "since_query", "order", "inflight",
        "inflight_bytes", "margin", "fwd_end", "peak_before", "largest",
        "swapped_in_fwd", "limit", "plan", "planned", "reactive", "cursor", "k",
        "reserve_k", "saved", "prev_saved", "rec_off", "rec_unswapped",
        "prev_off", "prev_growth", "guard_seen", "peak_marked", "slack",
        "released_seen", "fwd_evicted", "cap", "fwd_base", "fwd_marked", "bwd_peak",
        "seen", "sig", "profiles", "plan_before", "kept_movable", "step_base",
        "taught_base", "base_extra", "above_base_pad", "bwd", "bwd_lesson", "order_max",
        "last_clean",
    )

    def __init__(self, index: Optional[int]) -> None:
        self.index = index
        self.d2h = None
        self.h2d = None
        self.est = 0
        self.since_query = 1 << 30
        self.order: List[weakref.ref] = []
        self.inflight: collections.deque = collections.deque()
        self.inflight_bytes = 0
        self.margin: Optional[int] = None
        self.fwd_end: Optional[int] = None
        self.peak_before: Optional[int] = None
        self.largest = 0
        self.swapped_in_fwd = 0
        self.limit: Optional[int] = None
        self.k: Optional[float] = None  # learned margin / largest saved tensor
        self.reserve_k = 0.0  # prefetch headroom / largest saved tensor (raised on overrun)
        self.saved = 0       # bytes of eligible tensors saved so far in this forward
        self.prev_saved: Optional[int] = None  # ... in the whole previous forward
        self.rec_off: List[int] = []        # where this forward read the allocation
        self.rec_unswapped: List[int] = []  # ... and allocation + bytes swapped there
        self.prev_off: List[int] = []       # the previous forward's reading points
        self.prev_growth: List[int] = []    # ... and its growth_to_end there
        self.cursor = 0      # lowest pack position consumed in this backward
        self.plan = 0        # bytes to swap from the start of forward (learned)
        self.plan_before: Optional[int] = None  # the plan this step began with (set where
        #                                         forward ends, read after its backward)
        self.planned = 0     # bytes swapped by the plan in this forward
        self.reactive = 0    # bytes swapped under pressure in this forward
        self.guard_seen = 0  # the eviction net's evicted bytes when this phase began
        self.peak_marked = False  # the net's running peak was marked at backward's start
        self.slack = 0       # kept free on top of the learned margin (next_slack)
        self.released_seen = 0  # the allocator's released segments when the step began
        self.fwd_evicted = 0    # the net's evictions in this step's forward
        self.cap: Optional[int] = None  # what the caching allocator can have at most
        self.fwd_base = 0       # the allocation where the net's running peak was marked
        self.fwd_marked = False  # ... at this forward's start
        self.bwd_peak: Optional[int] = None  # the last backward's peak the margin learned from
        # the last reading of the allocation: (pass id, bytes allocated, self.saved then)
        self.seen: Optional[tuple] = None
        # the signature of the step under way and the lessons kept per signature
        self.sig: Optional[tuple] = None
        self.profiles = ShapeProfiles()
        self.kept_movable = 0  # bytes this forward kept on the device, evictable by the net
        # the allocation at this step's first save, at the first save of the step that
        # taught the plan, and the bytes the plan swaps on top for the difference
        self.step_base = 0
        self.taught_base: Optional[int] = None
        self.base_extra = 0
        # what forwards of this shape that begin above the plan's base needed beyond the
        # difference (learned from those the net rescued without a backward)
        self.above_base_pad: Optional[int] = None
        # backward's own memory by position: the one under way, and the last one's
        # lesson (kept per shape)
        self.bwd = BackwardProfile()
        self.bwd_lesson: Optional[BackwardLesson] = None
        self.order_max: List[int] = []  # largest swapped tensor at or below each position
        # the last step the net did not help: (its signature, bytes it swapped, the caching
        # allocator's releases in it), or None
        self.last_clean: Optional[tuple] = None
