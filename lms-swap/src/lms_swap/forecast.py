"""The step-to-step forecast of the swapper: the device limit it aims under, the room backward
needs (the margin), the bytes to swap from forward's start (the plan) and the headroom
prefetching leaves, learned at each phase boundary from what the step before did, and the rule
that applies them to each tensor forward saves (the plan's first, then the pressure rule).

:class:`StepForecast` is an object the swapper owns (as it owns its
:class:`~.copies.CopyPacer`): it is handed the swapper's tunables, the eviction net and a
reading of the device allocation, keeps what it learns in each device's state
(:class:`~.state.DevState`) and counts in its own ``counts``; the arithmetic itself is in
:mod:`.policy`.

It keeps one invariant across phases: each byte the eviction net moves is taught once, to the
phase it moved in (the net's counter is read at each phase boundary and the reading kept in
``guard_seen``), and each forward starts with an empty record of what it swapped and saved
(``planned``, ``reactive``, ``saved``, the allocation readings), so that what a step teaches is
that step's alone."""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional, Tuple

import torch

from . import device_memory
from .environment import GiB, MiB, allocator_lms
from .policy import (damped, growth_to_end, in_tail, next_margin_factor, next_plan,
                     next_reserve_factor, next_slack, predict_forward_end, releases_persist,
                     settled_plan, should_swap, swap_trigger)
from .profiles import signature
from .state import DevState

__all__ = ["StepForecast"]


def _allocator_cap(index: int, total: int) -> int:
    """Bytes the caching allocator lets this process reserve on device ``index``: the
    card, or less where ``torch.cuda.set_per_process_memory_fraction`` capped it."""
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.7
    if get is None:
        return total
    try:
        frac = float(get(index))
    except Exception:
        return total
    return int(total * frac) if 0.0 < frac < 1.0 else total


class StepForecast:
    """Limits, margin, plan and prefetch headroom, learned between steps, for the swapper that
    owns it: ``config`` (its tunables), ``guard()`` (the eviction net, armed, or None),
    ``allocated_of(st)`` (a reading of the device allocation) and ``meter()`` (a running
    peak: ``mark_peak``, ``peak_growth`` and ``released`` of a device; the net's, or a
    pluggable allocator's, or None; default: the net's).  The swapper calls
    :meth:`begin_forward` and :meth:`begin_backward` for each device at the phase boundaries,
    :meth:`enter_profile` at a forward's first save, :meth:`decide` for each tensor forward
    may swap and :meth:`backward_boundary` at each unpack of a swapped tensor.  Counts what it
    learned and what the net moved in ``counts``."""

    def __init__(self, config: Any, guard: Callable[[], Any],
                 allocated_of: Callable[[DevState], int],
                 meter: Optional[Callable[[], Any]] = None) -> None:
        self.config = config
        self._guard = guard
        self._allocated_of = allocated_of
        self._meter = meter if meter is not None else guard
        self.reset()

    def reset(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    # -- limits ------------------------------------------------------------------------
    def limit(self, st: DevState) -> int:
        """The device allocation the swapper aims under (read once, kept in ``st.limit``)."""
        if st.limit is None:
            cfg = self.config
            if cfg.device_limit is not None:
                st.limit = int(cfg.device_limit)
            elif st.index is None:
                st.limit = 1 << 62
            else:
                lim = cap = 0
                lms = allocator_lms()
                get = getattr(lms, "get_limit_lms", None) if lms else None
                if get is None:
                    get = getattr(torch.cuda, "get_limit_lms", None)
                if get is not None:
                    try:
                        lim = int(get())
                    except Exception:
                        lim = 0
                total = torch.cuda.get_device_properties(st.index).total_memory
                # a cap the user gave the caching allocator (set_per_process_memory_fraction)
                # is the device as far as this process is concerned
                total = _allocator_cap(st.index, total)
                if lim <= 0 or lim > total:
                    if cfg.device_limit_fraction is not None:
                        lim = int(total * float(cfg.device_limit_fraction))
                    elif self._guard() is not None:
                        # what the caching allocator can have, less 1% that its cache
                        # loses to fragmentation: aiming at 98% of the card swapped at
                        # batches stock PyTorch trains (its largest run at 96-99% of an
                        # H100); aiming at all of it, ViT-L at such a batch failed an
                        # allocation in a fragmented cache in backward, which the net
                        # caught (a second per step).  Too high costs an eviction by
                        # the net, not the job.
                        free, _ = torch.cuda.mem_get_info(st.index)
                        cap = min(total, int(free) + device_memory.reserved(st.index))
                        lim = cap - cap // 100
                    else:
                        lim = int(total * 0.98)
                st.limit = lim
                st.cap = max(cap, lim)
        return st.limit

    def cap(self, st: DevState) -> int:
        """What the caching allocator can have at most: free plus reserved memory when
        the net sets the limit, else the limit itself."""
        lim = self.limit(st)
        return st.cap if st.cap is not None else lim

    def margin(self, st: DevState) -> int:
        """Room kept for backward's own allocations: a fixed ``margin``, else the learned
        factor (``margin_factor`` until a step was seen) times the largest saved tensor
        (backward's gradients scale with it)."""
        cfg = self.config
        if cfg.margin is not None:
            st.margin = int(cfg.margin)
        elif st.k is not None:
            st.margin = max(int(cfg.min_margin), int(st.k * st.largest)) + st.slack
        elif cfg.first_margin_fraction is None and self._net_idle(st):
            # first step, with the net, until the net first has to move something: no
            # forecast (a step that fits swaps nothing and pins no host memory)
            st.margin = int(cfg.min_margin)
        else:
            # first step without the net, or after the net showed the step does not fit
            # (its copies are synchronous, into pageable memory: on an H100 the first
            # step of a Llama at 2x took 72 s with the net moving 60 GB, 42 s with this
            # rule, the net moving 33 GB): nothing
            # learned, and the largest tensors may come last (a language model's loss):
            # keep a share of the limit as well
            frac = 0.35 if cfg.first_margin_fraction is None else cfg.first_margin_fraction
            st.margin = max(int(cfg.min_margin), int(cfg.margin_factor * st.largest),
                            int(float(frac) * self.limit(st)))
        return st.margin

    def prefetch_reserve(self, st: DevState) -> int:
        """Device memory prefetching leaves free for backward's own allocations: the
        margin, and at least ``prefetch_reserve_factor`` times the largest saved tensor
        (raised by a quarter after a step whose backward went over the limit).  Not
        learned down: backward's biggest allocations (ResNet-50's first layers allocate
        twice their largest activation in fp32) come at moments the prefetch level does
        not predict."""
        return max(self.margin(st), int(self.reserve_factor(st) * st.largest) + 256 * MiB)

    def reserve_factor(self, st: DevState) -> float:
        """The prefetch headroom per byte of the largest saved tensor: the tunable, or more
        where a backward went over the limit."""
        return max(float(self.config.prefetch_reserve_factor), st.reserve_k)

    def min_margin_factor(self) -> float:
        """The floor of the learned margin factor: ``min_margin_factor``, else 0 with the
        net and 1 without it."""
        f = self.config.min_margin_factor
        if f is None:
            f = 0.0 if self._guard() is not None else 1.0
        return float(f)

    # -- the rule for each tensor ------------------------------------------------------
    def decide(self, st: DevState, nbytes: int,
               saved_before: int) -> Tuple[Optional[str], bool]:
        """Why a tensor of ``nbytes`` that forward saves after ``saved_before`` bytes, and
        that could be swapped, is swapped: ``"plan"`` while the plan (and the base the step
        began above its lesson) is not swapped yet, else ``"pressure"`` where
        :meth:`pressure` says so, else None (kept); and whether it waits for earlier
        copies (under pressure)."""
        tail = in_tail(saved_before, nbytes, st.prev_saved, st.largest)
        pressure = self.pressure(st, nbytes, tail)
        if st.planned < st.plan + st.base_extra:
            return "plan", pressure
        if pressure:
            return "pressure", True
        return None, False

    def pressure(self, st: DevState, nbytes: int, tail: bool = False) -> bool:
        """Whether the device allocation (which includes the tensor being saved) is over
        the trigger by :func:`~.policy.should_swap`; for a tensor of the tail
        (:func:`~.policy.in_tail`), only whether it is over the limit itself; while the
        tensor and one more like it fit under the limit, also whether the previous step
        predicts forward's end over the trigger (:func:`~.policy.predict_forward_end`).
        Queries the allocator only every ``query_every`` tensors while the estimate stays
        far below the trigger.  (A version that only waited for running copies instead of
        swapping, when those copies alone explained the pressure, ran out of device memory
        at 1.5x on the H100: the allocator no longer counts tensors whose copy is still
        running.)"""
        limit, margin = self.limit(st), self.margin(st)
        trigger = swap_trigger(limit, margin)
        st.since_query += 1
        slack = max(2 * st.largest, 1 * GiB)
        if st.est + nbytes <= trigger - slack and st.since_query < self.config.query_every:
            st.est += nbytes
            return False
        alloc = self._allocated_of(st)
        st.est = alloc
        st.since_query = 0
        st.rec_off.append(st.saved)
        # what the net moved is gone from the allocation as much as what was swapped
        st.rec_unswapped.append(alloc + st.planned + st.reactive + self._net_moved(st))
        if not should_swap(nbytes, alloc, limit, margin):
            return False
        if tail and alloc <= limit:
            self.counts["tail_kept"] += 1
            return False
        if alloc + nbytes <= limit:
            # the previous step knows how this forward goes on: swap only when its end,
            # not this moment's transients and one tensor looked ahead, would be over
            # the trigger (GPT-2 on the H100 swapped a loss chunk per step for the
            # logits that were alive while it was saved)
            end = predict_forward_end(alloc, st.saved, st.prev_off, st.prev_growth,
                                      st.prev_saved)
            if end is not None and end <= trigger:
                self.counts["predicted_kept"] += 1
                return False
        return True

    # -- phases ----------------------------------------------------------------------
    def begin_forward(self, st: DevState, abandoned: bool = False) -> None:
        """The first pack after a backward, on one device: learn from the step that ended
        (the margin, the slack, the plan's settling, backward's lesson) and start this
        forward's record.  ``abandoned``: the step that ended was a forward dropped without
        a backward (an evaluation pass with autograd on)."""
        if abandoned:
            # the net's moves since that forward began were its own, not a backward's
            bwd_evicted = 0
            st.fwd_evicted = self._net_evicted(st, "guard_forward_bytes")
            if st.fwd_evicted > 0:
                self._learn_from_rescue(st, st.fwd_evicted)
        else:
            # what the net moved in backward is memory backward needed beyond its peak.
            # (Not only the failed requests' sizes, which are smaller: at a batch stock
            # PyTorch trains, 99% of an H100, ViT-L's backward failed for want of one
            # piece in a fragmented cache, and a margin raised by the requests alone let
            # it fail in 9 of the next 10 steps, each costing a second.)
            bwd_evicted = self._net_evicted(st, "guard_backward_bytes")
        meter = self._meter()
        measured = None
        # the net had to help a backward that prefetched by the lesson: the lesson
        # was wrong, not the margin (its peak counts the prefetched bytes)
        overrun = bwd_evicted > 0 and st.bwd.used
        if overrun:
            self.counts["prefetch_lesson_overruns"] += 1
        if meter is not None and st.index is not None and st.peak_marked:
            # backward's own memory by position, for the next backward of this shape
            measured, st.bwd_lesson = st.bwd.end(
                meter.peak_growth(st.index), bwd_evicted, self.limit(st),
                st.fwd_evicted)
            st.peak_marked = False
        if meter is not None and st.index is not None:
            released = meter.released(st.index)
            releases = released - st.released_seen
            swapped = st.planned + st.reactive
            clean = st.fwd_evicted == 0 and bwd_evicted == 0
            st.slack = next_slack(st.slack, releases > 0,
                                  swapped + st.fwd_evicted + bwd_evicted, self.limit(st))
            if st.plan_before is not None and self.config.policy == "auto":
                # releases the step before, which swapped more, had as well are none
                # of this plan's doing (releases_persist)
                persisted = (clean and self.config.settle_when_releases_persist
                             and releases_persist(swapped, releases, self._clean_before(st)))
                harmless = clean and (releases == 0 or persisted)
                settled = settled_plan(st.plan, st.plan_before, swapped, harmless)
                if settled < st.plan:
                    self.counts["plan_raises_undone"] += 1
                    if persisted:
                        self.counts["plan_settled_past_releases"] += 1
                st.plan = settled
            st.released_seen = released
            st.last_clean = (st.sig, swapped, releases) if clean else None
        st.plan_before = None
        if (st.index is not None and st.fwd_end is not None and st.largest
                and self.config.adaptive_margin and self.config.margin is None
                and not overrun):
            # with a running peak, exact: the highest of its peaks over backward's
            # intervals (BackwardProfile.end above)
            peak, exact = ((int(measured), True) if measured is not None
                           else self._backward_peak(st))
            st.bwd_peak = peak + bwd_evicted
            before = 0 if (exact or bwd_evicted > 0) else (st.peak_before or 0)
            old_k = st.k
            st.k = next_margin_factor(st.k, st.largest, st.fwd_end,
                                      before, peak + bwd_evicted,
                                      int(self.config.min_margin),
                                      self.min_margin_factor())
            st.k = damped(st.k, old_k)
            # over the limit is harm only where the net had to move memory (the
            # allocator's own retries are the slack's business); without the net,
            # from a step that set a new peak
            if (bwd_evicted > 0) if exact else (peak > (st.peak_before or 0)):
                st.reserve_k = next_reserve_factor(self.reserve_factor(st), peak,
                                                   self.limit(st))
            self.counts["margin_updates"] += 1
        if meter is not None and st.index is not None and self.config.policy == "auto":
            # forward's own peak, read at backward's start (_forward_peak_over)
            st.fwd_base = self._allocated_of(st)
            meter.mark_peak(st.index)
            st.fwd_marked = True
        st.fwd_end = None
        st.since_query = 1 << 30
        st.est = 0
        st.planned = 0
        st.reactive = 0
        st.fwd_evicted = 0
        st.saved = 0
        st.kept_movable = 0
        st.rec_off, st.rec_unswapped = [], []

    @staticmethod
    def _clean_before(st: DevState) -> Optional[tuple]:
        """(bytes swapped, the caching allocator's releases) of the step before this one
        where it was of this step's shape and the net did not help it, else None."""
        last = st.last_clean
        if last is None or last[0] != st.sig:
            return None
        return last[1], last[2]

    def _learn_from_rescue(self, st: DevState, moved: int) -> None:
        """A forward dropped without a backward needed the net to move ``moved`` bytes.
        It has no end and no backward to teach the plan (:meth:`begin_backward`), so it
        would need the net again at its next pass.  Where it began above the plan's base
        (an evaluation pass with autograd on between a backward and the optimizer's next
        ``zero_grad``: the gradients are on the device), what it needed beyond that
        difference is kept for the forwards of its shape that begin above the base, and
        the training steps of that shape keep their plan; where it began at the base, the
        plan rises by what the net moved.  (On the H100 a decoder at 2.0x whose length
        cycles: each such pass at 2048 tokens needed 1.4 GB from the net, the same each
        time.)"""
        self.counts["abandoned_rescues"] += 1
        if st.base_extra > 0:
            st.above_base_pad = (st.above_base_pad or 0) + int(moved)
        else:
            st.plan = int(st.plan or 0) + int(moved)
            if st.taught_base is None:
                st.taught_base = st.step_base

    def enter_profile(self, st: DevState, t: torch.Tensor) -> None:
        """The forward that saves ``t`` first begins: what earlier steps of its shape
        taught replaces what the step before taught (:mod:`.profiles`)."""
        base = self._allocated_of(st) if st.index is not None else 0
        how = st.profiles.enter(st, signature(t))  # (saves the last step's base first)
        st.step_base, st.base_extra = base, 0
        if how is not None:
            self.counts["profile_" + how] += 1
            if st.plan and st.taught_base is not None and base > st.taught_base:
                # more on the device than when the lesson was learned: the plan's
                # swaps must make room for that too
                st.base_extra = base - st.taught_base + (st.above_base_pad or 0)
                self.counts["plan_base_raises"] += 1

    def _backward_peak(self, st: DevState) -> Tuple[int, bool]:
        """Backward's peak where no running peak measured it: the program's
        ``max_memory_allocated``, which lms_swap must not reset: an older step's peak
        when this one set none, so only an upper bound (a first step at twice the
        memory held a UNet's margin at 28.5 GB for good)."""
        return device_memory.peak_allocated(st.index), False

    def backward_boundary(self, st: DevState, h: Any) -> None:
        """Backward unpacks swapped tensor ``h``: one interval of backward's memory ends
        and the next begins (:class:`~.backward_profile.BackwardProfile`)."""
        meter = self._meter()
        if meter is None or not st.bwd.recording or h.offset is None or st.index is None:
            return
        st.bwd.boundary(h.offset, meter.peak_growth(st.index), self._allocated_of(st))
        meter.mark_peak(st.index)

    def _forward_peak_over(self, st: DevState) -> Optional[int]:
        """How far this forward's peak went over what the allocator can have (negative:
        under it), by the running peak since forward's start; None without one, or
        when forward's start was not marked."""
        meter = self._meter()
        if meter is None or not st.fwd_marked:
            return None
        st.fwd_marked = False
        peak = st.fwd_base + int(meter.peak_growth(st.index))
        return peak - self.cap(st)

    def _net_evicted(self, st: DevState, counter: str) -> int:
        """Bytes the eviction net moved since the last phase began (counted under
        ``counter``)."""
        guard = self._guard()
        now = guard.evicted_bytes() if guard is not None else 0
        moved, st.guard_seen = now - st.guard_seen, now
        if moved > 0:
            self.counts[counter] += moved
        return moved

    def _net_moved(self, st: DevState) -> int:
        """Bytes the eviction net has moved so far in this phase (0 without the net)."""
        guard = self._guard()
        return guard.evicted_bytes() - st.guard_seen if guard is not None else 0

    def _net_idle(self, st: DevState) -> bool:
        """Whether the eviction net is there and has moved nothing in this phase."""
        return self._guard() is not None and self._net_moved(st) == 0

    def begin_backward(self, st: DevState) -> None:
        """The first unpack after a forward, on one device: learn from the forward that
        ended (its end, its growth to the end, the next plan) and mark the net's running
        peak for backward's lesson."""
        # the net's evictions in forward were swaps the forecast should have planned
        fwd_evicted = st.fwd_evicted = self._net_evicted(st, "guard_forward_bytes")
        st.prev_saved = st.saved
        if st.index is not None and self.config.policy == "auto":
            st.fwd_end = self._allocated_of(st)
            peak_over = self._forward_peak_over(st)
            meter = self._meter()
            if meter is not None:
                meter.mark_peak(st.index)
                st.peak_marked = True
                st.bwd.begin(st.fwd_end)
            else:
                # without a running peak: the program's peak so far, which the next
                # forward compares backward's against (_backward_peak)
                st.peak_before = device_memory.peak_allocated(st.index)
            st.prev_off = st.rec_off
            # the net's evictions count as swapped: left out, an end they lowered
            # predicts the next forward under the trigger, it keeps what it should
            # swap, and the net evicts again at the same place every step (on an
            # H100 a Llama at 1.5x: 8 GB a step, synchronously, 7-8.6 s a step)
            st.prev_growth = growth_to_end(st.rec_off, st.rec_unswapped, st.fwd_end,
                                           st.planned + st.reactive + fwd_evicted)
            st.rec_off, st.rec_unswapped = [], []
            if self.config.plan:
                st.taught_base = st.step_base  # the plan below is this base's
                st.plan_before = st.plan
                trig = swap_trigger(self.limit(st), self.margin(st))
                swapped = st.planned + st.reactive + fwd_evicted
                if swapped == 0 and st.fwd_end <= trig:
                    plan = 0
                else:
                    plan = next_plan(swapped, st.fwd_end, trig,
                                     max(256 * MiB, self.limit(st) // 128),
                                     peak_over, rescued=fwd_evicted > 0)
                st.plan = int(damped(plan, st.plan or None))
