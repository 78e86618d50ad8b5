"""The swapper: saved-tensor hooks that swap activations out under pressure and bring them
back ahead of backward, and the bookkeeping of each step's phases around them.  It owns what
does the rest: the forecast (:class:`~.forecast.StepForecast`), the pacing of forward's copies
out (:class:`~.copies.CopyPacer`), backward's copies in (:class:`~.prefetch.Prefetcher`),
the host pool (:class:`~.host_pool.HostPool`) and the choice of the losses that run in blocks
(:class:`~.loss_chunking.LossChunking`).

Invariant: autograd holds, for each tensor saved, that tensor (without its history) or a handle
that gives back its exact bytes and returns its host memory when dropped; a step's phase
changes once per forward and once per backward, under the swapper's lock."""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

import torch

from . import device_memory
from .autograd_facts import COMPILED_OOM, in_backward, in_compiled_graph, no_history
from .chunked_loss import MIN_BYTES, hand_over
from .copies import CopyPacer, copy_into_pieces, flat_bytes, plain_bytes
from .environment import (GiB, LMSHostMemoryError, OutOfMemoryError, allocator_lms,
                          host_budget_default, host_mem_limit_from_env, host_total)
from .forecast import StepForecast
from .guard import HOST_FULL_WORDS, arm_guard, load_guard, loaded_guard
from .host_pool import HostPool
from .loss_chunking import LossChunking
from .pinned import releaser
from .policy import SwapConfig, dense_span, storage_bytes
from .prefetch import Prefetcher
from .report import swap_stats
from .state import DevState, Swapped, check_version

__all__ = ["ActivationSwapper"]


def _device_key(device: torch.device) -> Optional[int]:
    """The key of a device's state in the swapper: its CUDA index, None for the CPU."""
    return device.index if device.type == "cuda" else None


class ActivationSwapper:
    """Saved-tensor hooks that swap activations to host memory under pressure.

    An instance is a context manager (like ``save_on_cpu``)::

        swapper = ActivationSwapper(prefetch_depth=6)
        with swapper:
            loss = model(x)
        loss.backward()

    It can be entered several times (and in several threads); all uses share one host
    pool and one set of statistics.
    """

    def __init__(self, pool: Optional[HostPool] = None, **kw: Any) -> None:
        self.config = SwapConfig(**kw)
        self._lock = threading.RLock()
        self._pool = pool
        self._dev: Dict[Any, DevState] = {}
        self._dedupe: Dict[int, tuple] = {}
        self._phase = "idle"
        self._pass_id = 0
        self._prefetch_pending = False
        self._kept_unpacks = 0
        self._sig_pending = False
        self._fwd_last: Optional[weakref.ref] = None
        self._fwd_handles: List[weakref.ref] = []
        self._trace: List[tuple] = []
        self._t0 = time.perf_counter()
        self._tls = threading.local()  # per-thread stack of entered hooks
        self._forecast = StepForecast(self.config, self._guard, self._allocated, self._meter)
        self._pacer = CopyPacer(self.config, self._forecast.limit, self._allocated,
                                lambda: self._pass_id)
        self._prefetcher = Prefetcher(self.config, self._forecast, self._allocated,
                                      lambda: self._pass_id)
        self._loss = LossChunking(self.config, self._tls, self._lock, self._state,
                                  self._allocated, self._guard, self._forecast.cap)
        # the parts that keep counters of their own (stats sums them; a reset resets them)
        self._parts = (self._pacer, self._forecast, self._prefetcher, self._loss)
        self._reset_counters()

    # -- configuration -------------------------------------------------------------
    def configure(self, **kw: Any) -> "ActivationSwapper":
        with self._lock:
            self.config.update(**kw)
            if "host_limit" in kw or "host_min_available" in kw:
                if self._pool is not None:
                    lim, minav = self._host_limits()
                    self._pool.limit, self._pool.min_available = lim, minav
                    self._share_host_budget()
            for st in self._dev.values():
                st.limit = None
                if "margin" in kw:
                    st.margin = None
        return self

    def _host_limits(self) -> tuple:
        cfg = self.config
        total = host_total()
        limit = cfg.host_limit
        if limit is None and (total or host_mem_limit_from_env() is not None):
            # PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB, else 80% of the host shared by the node's
            # processes (8 ranks each taking 80% of it would be the kernel's OOM killer's
            # business, not an error of ours): the patched allocator's rule where this
            # torch has it, else lms_swap's copy (environment.host_budget_source)
            limit = host_budget_default(total)
        if limit is None:
            limit = 64 * GiB  # no /proc/meminfo to take 80% of
        minav = cfg.host_min_available
        if minav is None:
            minav = max(2 * GiB, int(total * 0.05)) if total else 0
        return int(limit), int(minav)

    @property
    def pool(self) -> HostPool:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    limit, minav = self._host_limits()
                    lms = allocator_lms()
                    reserve = getattr(lms, "_host_reserve", None) if lms else None
                    release = getattr(lms, "_host_release", None) if lms else None
                    if reserve is None or release is None:
                        reserve = release = None
                    pin = self.config.device_type == "cuda" and torch.cuda.is_available()
                    guard = self._guard()
                    self._pool = HostPool(
                        limit, pin=pin, min_available=minav,
                        reserve_fn=reserve, release_fn=release,
                        extra_fn=guard.host_bytes if guard is not None else None,
                        on_change=(self._share_host_budget if guard is not None else None),
                        net=guard,
                    )
                    if guard is not None:
                        releaser.set_on_pending(guard.add_releasing)
                    self._share_host_budget()
        return self._pool

    def _share_host_budget(self, held: Optional[int] = None) -> None:
        """Tells the eviction net (once loaded) the host limit and the bytes the pinned
        pool holds under it (``held``, else its :attr:`~HostPool.reserved`); the pool's
        idle chunks are offered to the net, which gives them back when it needs the room
        (see HostPool)."""
        guard, pool = loaded_guard(), self._pool
        if guard is not None and pool is not None and self.config.guard:
            guard.set_host_budget(pool.limit, pool.reserved if held is None else held,
                                  pool.min_available)

    def _guard(self) -> Any:
        """The eviction net, armed, or None (``guard=False``, CPU, not buildable, or under
        the LMS pluggable allocator)."""
        cfg = self.config
        if not cfg.guard or cfg.device_type != "cuda" or cfg.policy == "never":
            return None
        if device_memory.peak_meter() is not None:
            # the LMS pluggable allocator is installed: its page moves catch what the
            # forecast misses, in the net's place (which could not sit under it), so no
            # warning that the net is missing
            return None
        g = load_guard()
        if g is not None and not g.armed():
            limit, minav = self._host_limits()
            held = self._pool.reserved if self._pool is not None else 0
            g = arm_guard(g, limit, held, minav)
        return g

    def _meter(self) -> Any:
        """The running peak the forecast measures backward by: the net's, else a pluggable
        allocator's (:func:`~.device_memory.peak_meter`), else None."""
        g = self._guard()
        if g is not None:
            return g
        return device_memory.peak_meter() if self.config.device_type == "cuda" else None

    # -- context manager / hooks ---------------------------------------------------
    def __enter__(self) -> "ActivationSwapper":
        h = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        h.__enter__()
        stack = getattr(self._tls, "hooks", None)
        if stack is None:
            stack = self._tls.hooks = []
        stack.append(h)
        self._loss.enter()
        return self

    def __exit__(self, *exc: Any) -> None:
        h = self._tls.hooks.pop()
        h.__exit__(*exc)
        self._loss.exit()
        if isinstance(exc[1], OutOfMemoryError) and in_compiled_graph(exc[2]):
            raise OutOfMemoryError(COMPILED_OOM + str(exc[1])) from exc[1]
        if (isinstance(exc[1], OutOfMemoryError) and not isinstance(exc[1], LMSHostMemoryError)
                and HOST_FULL_WORDS in str(exc[1])):
            # the net refused for the host limit: the same error as a planned swap's
            raise LMSHostMemoryError(str(exc[1])) from exc[1]

    # -- statistics ----------------------------------------------------------------
    def _reset_counters(self) -> None:
        self.c = collections.Counter()
        for part in self._parts:
            part.reset()

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            counts = collections.Counter(self.c)
            for part in self._parts:
                counts.update(part.counts)
            return swap_stats(counts, self._pacer.throttle_s, self._dev,
                              self._forecast.prefetch_reserve, self._pool, self.config.guard)

    def reset_stats(self) -> None:
        with self._lock:
            self._reset_counters()
            self._trace.clear()
            if self._pool is not None:
                self._pool.reset_peaks()

    def trace(self) -> List[tuple]:
        with self._lock:
            return list(self._trace)

    def empty_cache(self) -> int:
        return self._pool.empty_cache() if self._pool is not None else 0

    # -- device helpers --------------------------------------------------------------
    def _state(self, t: torch.Tensor) -> DevState:
        key = _device_key(t.device)
        st = self._dev.get(key)
        if st is None:
            st = DevState(key)
            if key is not None:
                st.d2h = torch.cuda.Stream(device=t.device)
                st.h2d = torch.cuda.Stream(device=t.device)
                guard = self._guard()
                if guard is not None:  # the net's counter is the process's
                    st.guard_seen = guard.evicted_bytes()
            self._dev[key] = st
        return st

    def _allocated(self, st: DevState) -> int:
        self.c["memory_queries"] += 1
        if st.index is None:
            return 0
        alloc = device_memory.allocated(st.index)
        st.seen = (self._pass_id, alloc, st.saved)
        return alloc

    def _record_trace(self, st: DevState, what: str) -> None:
        alloc = self._allocated(st) if st.index is not None else 0
        host = self._pool.in_use if self._pool is not None else 0
        self._trace.append((time.perf_counter() - self._t0, what, alloc, host))

    # -- phases ----------------------------------------------------------------------
    def _begin_forward(self) -> None:
        """First pack after a backward: the forecast learns from the step that ended, and
        a new swap order begins (the handles still alive keep their places, renumbered).
        Also where the forward under way was dropped without a backward (``abandoned``)."""
        abandoned = self._phase == "fwd"
        self._phase = "fwd"
        self._dedupe.clear()
        self._prefetch_pending = False
        self._sig_pending = True
        self._fwd_last, self._fwd_handles = None, []
        if self._pool is not None:
            self._pool.end_step()
        for st in self._dev.values():
            self._forecast.begin_forward(st, abandoned)
            alive = [r for r in st.order if r() is not None]
            for i, r in enumerate(alive):
                h = r()
                if h is not None:
                    h.index = i
            st.order = alive
            st.swapped_in_fwd = 0

    def _begin_backward(self) -> None:
        """First unpack after a forward: the forecast learns from the forward that ended;
        prefetching starts at the end of the swap order; finished copies out are forgotten."""
        self._phase = "bwd"
        self._pass_id += 1
        self._dedupe.clear()
        self._kept_unpacks = 0
        self._prefetch_pending = any(st.swapped_in_fwd for st in self._dev.values())
        for st in self._dev.values():
            self._forecast.begin_backward(st)
            self._prefetcher.begin_backward(st)
            self._pacer.drain(st, wait=False)

    # -- pack ------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        """The pack hook: what :meth:`_pack_tensor` keeps goes to autograd without its
        history (:func:`~.autograd_facts.no_history`), whichever way it was kept."""
        packed = self._pack_tensor(t)
        return no_history(t) if packed is t else packed

    def _pack_tensor(self, t: torch.Tensor) -> Any:
        """A handle for ``t`` (swapped, or kept evictable by the net), or ``t`` itself
        where it stays as it is."""
        cfg = self.config
        if t.is_leaf and t.requires_grad:
            return t  # parameters
        if (cfg.policy == "never" or t.device.type != cfg.device_type
                or not plain_bytes(t) or type(t) is not torch.Tensor):
            return t  # (subclasses: DTensor, fake tensors, ...)
        nbytes = t.numel() * t.element_size()
        with self._lock:
            if in_backward():
                # recomputation inside backward (reentrant checkpointing, double
                # backward): backward uses these at once, and they are no forward's
                return self._save_in_backward(t, nbytes)
            if self._phase != "fwd" or self._forward_abandoned():
                self._begin_forward()
            if self._sig_pending and t.device.type == "cuda":
                self._sig_pending = False
                self._forecast.enter_profile(self._state(t), t)
            if nbytes < cfg.size_threshold or nbytes == 0:
                self.c["small_count"] += 1
                return t
            if cfg.dedupe:
                ent = self._dedupe.get(id(t))
                if ent is not None and ent[0]() is t and ent[1] == t._version:
                    if ent[2] is None:
                        self.c["dedupe_hits"] += 1
                        return t
                    h = ent[2]()
                    if h is not None and h.owner is not None:
                        self.c["dedupe_hits"] += 1
                        h.refs += 1
                        return h
            st = self._state(t)
            if nbytes > st.largest:
                st.largest = nbytes
            why, wait, eligible = self._decide(st, t, nbytes)
            h = None
            if why is not None:
                try:
                    h = self._swap_out(st, t, nbytes, wait)
                except LMSHostMemoryError:
                    if not self._may_keep(st, why, nbytes):
                        raise
                    # swap space is full but the device has room under its limit: the
                    # tensor stays (the margin is a forecast, the limit is not)
                    self.c["host_full_kept"] += 1
                if h is not None and why == "plan":
                    st.planned += nbytes
                    self.c["planned_count"] += 1
                elif h is not None and why == "pressure":
                    st.reactive += nbytes
                    self.c["reactive_count"] += 1
            if h is None:
                self.c["kept_count"] += 1
                self.c["kept_bytes"] += nbytes
                # a kept tensor takes memory as well: once the plan is done, the rest of
                # forward fills the device while the copies of the plan still run
                self._pacer.bound(st, 0)
                if eligible and st.index is not None:
                    h = self._keep_evictable(t, nbytes)
                    if h is not None:
                        st.kept_movable += nbytes
            if cfg.dedupe:
                # weak references only: an abandoned graph must free its buffers
                self._dedupe[id(t)] = (weakref.ref(t), t._version,
                                       None if h is None else weakref.ref(h))
            packed = no_history(t) if h is None else h
            if packed is not t:
                self._note_handle(packed)
            if cfg.trace:
                self._record_trace(st, "out" if h is not None else "keep")
            return packed

    def _save_in_backward(self, t: torch.Tensor, nbytes: int) -> Any:
        """A tensor saved while backward runs: kept on the device, where backward needs
        it next, evictable by the net where it could be swapped at all; the forecast's
        forward state is left alone."""
        self.c["backward_saves"] += 1
        if (nbytes < self.config.size_threshold or nbytes == 0 or not dense_span(t)
                or t.device.type != "cuda"):
            return t
        storage = storage_bytes(t)
        if storage and nbytes < self.config.min_storage_fraction * storage:
            return t
        h = self._keep_evictable(t, nbytes)
        return t if h is None else h

    def _note_handle(self, h: Any) -> None:
        """Remembers the newest object this forward gave autograd to hold (a handle, or
        the alias of a kept tensor): it lives exactly as long as the graph holds it
        (see _forward_abandoned)."""
        self._fwd_last = weakref.ref(h)
        self._fwd_handles.append(self._fwd_last)

    def _forward_abandoned(self) -> bool:
        """Whether the forward under way was dropped without a backward (an evaluation
        pass with autograd on, a loss that is never differentiated): everything it gave
        autograd to hold (_note_handle) is gone.  The next pack then begins a new
        forward.  Checked in full only when the newest of them is gone, which a live
        forward's graph never lets happen."""
        last = self._fwd_last
        if last is None or last() is not None:
            return False
        if any(r() is not None for r in self._fwd_handles):
            return False
        self.c["forwards_abandoned"] += 1
        return True

    def _decide(self, st: DevState, t: torch.Tensor, nbytes: int) -> tuple:
        """(why it is swapped: None (kept), "always", "plan" or "pressure"; wait for
        earlier copies if too many are in flight?; could it be swapped at all?)"""
        cfg = self.config
        saved_before = st.saved
        st.saved += nbytes
        if not dense_span(t):
            self.c["not_dense_kept"] += 1
            return None, False, False
        storage = storage_bytes(t)
        if storage and nbytes < cfg.min_storage_fraction * storage:
            # a small view of a big storage: swapping it would not free the storage
            self.c["partial_view_kept"] += 1
            return None, False, False
        if cfg.policy == "always":
            return "always", True, True
        if self._loss.takes_input(t):  # (counted in loss_inputs_to_host there)
            return "pressure", True, True
        why, wait = self._forecast.decide(st, nbytes, saved_before)
        return why, wait, True

    def _keep_evictable(self, t: torch.Tensor, nbytes: int) -> Optional[Swapped]:
        """A handle for a tensor that stays on the device, registered with the eviction
        net (which may move it to host memory if the device runs out); None without the
        net (autograd then holds the tensor itself, as stock)."""
        guard = self._guard()
        if guard is None:
            return None
        return Swapped.of(self, t, nbytes, slot=guard.Slot(t))

    def _may_keep(self, st: DevState, why: str, nbytes: int) -> bool:
        """Whether a tensor that found no swap space may stay on the device: not under
        ``policy="always"``, and only while the device allocation, with as much again
        for the next output, stays under the limit."""
        if why == "always":
            return False
        return self._allocated(st) + nbytes <= self._forecast.limit(st)

    def _swap_out(self, st: DevState, t: torch.Tensor, nbytes: int,
                  wait: bool = True) -> Optional[Swapped]:
        pieces = self.pool.alloc_pieces(nbytes)  # may raise LMSHostMemoryError
        h = Swapped.of(self, t, nbytes, host=pieces)
        h.offset = st.saved - nbytes  # (_decide counted it already)
        src = flat_bytes(t)
        if st.index is None:
            copy_into_pieces(pieces, src, non_blocking=False)
            h.d2h_event = None
        else:
            cur = torch.cuda.current_stream(t.device)
            st.d2h.wait_stream(cur)
            with torch.cuda.stream(st.d2h):
                copy_into_pieces(pieces, src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(st.d2h)
            # the caching allocator must not reuse t's memory before the copy ran
            t.record_stream(st.d2h)
            h.d2h_event = ev
            st.inflight.append((ev, nbytes))
            st.inflight_bytes += nbytes
            if wait and self.config.policy == "auto":
                # under pressure: let no earlier copy wait, so the device allocation
                # never goes more than this tensor over the trigger
                self._pacer.drain(st, wait=True, allowance=nbytes)
            else:
                self._pacer.drain(st, wait=wait)
        self._pacer.bound(st, nbytes)
        h.index = len(st.order)
        st.order.append(weakref.ref(h))
        st.swapped_in_fwd += 1
        self.c["out_count"] += 1
        self.c["out_bytes"] += nbytes
        return h

    # -- unpack ----------------------------------------------------------------------
    def _unpack_kept(self, device: torch.device) -> None:
        """Backward unpacks a tensor that stayed on the device."""
        if self._phase == "fwd":
            with self._lock:
                if self._phase == "fwd":
                    self._begin_backward()
        if self._prefetch_pending:
            # backward is still in the part it kept on the device: use the time to
            # bring back the first swapped tensors it will need
            self._kept_unpacks += 1
            if self._kept_unpacks % 4 == 0 and self.config.prefetch_depth > 0:
                with self._lock:
                    st = self._dev.get(_device_key(device))
                    if st is not None and st.order:
                        self._prefetcher.prefetch(st, st.cursor, device)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, Swapped):
            self._unpack_kept(packed.device)
            return packed
        h = packed
        if h.slot is not None:
            t = h.slot.device_tensor()
            if t is not None:  # still on the device (the net did not need it)
                self._unpack_kept(h.device)
                check_version(h)
                return t
        with self._lock:
            if self._phase == "fwd":
                self._begin_backward()
            st = self._dev[_device_key(h.device)]
            if h.ahead:
                h.ahead = False
                st.bwd.consumed(h.nbytes)
            self._forecast.backward_boundary(st, h)
            if h.gpu is None:
                t = self._prefetcher.fetch(st, h)
                self.c["fetched_on_demand" if h.slot is None else "guard_fetched"] += 1
            else:
                t = h.gpu
                self.c["prefetch_hits"] += 1
            if h.pass_id != self._pass_id:
                h.pass_id = self._pass_id
                h.unpacks = 0
            h.unpacks += 1
            if h.unpacks >= h.refs:
                h.gpu = None  # autograd holds it while the node runs; refetch if needed
                if h.refs == 1 and h.nbytes >= MIN_BYTES:
                    hand_over(t)  # its one node may reuse it (the chunked loss does)
            if st.index is not None:
                cur = torch.cuda.current_stream(h.device)
                cur.wait_event(h.h2d_event)
                if h.gpu_stream != cur:
                    t.record_stream(cur)
            if h.index is not None:  # (an evicted slot is not in the swap order)
                if h.index < st.cursor:
                    st.cursor = h.index
                if self.config.prefetch_depth > 0:
                    self._prefetcher.prefetch(st, h.index, h.device)
            st.bwd.settle()
            if self.config.trace:
                self._record_trace(st, "in")
        check_version(h)
        return t

    # -- release -----------------------------------------------------------------------
    def release_handle(self, h: Swapped) -> None:
        """What a handle's owner does when the handle is dropped (:meth:`Swapped.__del__`):
        its host memory goes back to the pool, a copy in never used back to its stream."""
        if h.ahead:  # prefetched, never used
            h.ahead = False
            st = self._dev.get(_device_key(h.device))
            if st is not None:
                st.bwd.consumed(h.nbytes)
        host, h.host = h.host, None
        ev = h.h2d_event if h.h2d_event is not None else h.d2h_event
        if h.gpu is not None and h.h2d_event is not None and h.gpu_stream is not None:
            # fetched and never used: its memory goes back to the allocating stream,
            # which must not reuse it under the running copy (see Prefetcher.fetch)
            h.gpu_stream.wait_event(h.h2d_event)
        h.gpu = None
        if self._pool is not None and host is not None:
            for piece in host:
                self._pool.free(piece, ev)  # safe from any thread, never blocks
