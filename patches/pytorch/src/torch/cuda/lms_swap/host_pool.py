"""The exact-size pinned host pool that swapped tensors live in, and the thread that
gives its buffers back."""

from __future__ import annotations

import atexit
import collections
import contextlib
import mmap
import os
import queue
import threading
import time
from typing import Dict, List, Optional

import torch

from .environment import ENV_HOST_LIMIT, LMSHostMemoryError, _fmt, _host_available


try:
    _PAGE = max(4096, int(os.sysconf("SC_PAGE_SIZE")))
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    _PAGE = 4096


class _Releaser:
    """Unpins and unmaps the host pool's buffers on one daemon thread.

    Giving back 20 GB of pinned buffers (``cudaHostUnregister``, then the unmap) took
    2.4 s on the H100 machine; done inline it stalled the step whose end aged them out.
    (pin_rate.py, run 80: unpinning 1 GiB takes 0.06 s with GPU work queued, it does
    not wait for that work; the unmap after it 0.15 s.  Done at the step boundary on
    the training thread instead, the same 40 GB cost one step 2.5-4 s, about what this
    thread's overlap cost spread over 11 steps.)
    :attr:`pending` counts the bytes queued and not yet given back: the pool counts them
    against its limit and the machine's floor, and :meth:`wait` until they are gone
    before it reports a limit reached.  Nothing queued here is used again."""

    def __init__(self) -> None:
        self._q: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.pending = 0
        self.errors = 0

    def put(self, buf: torch.Tensor, event, device: Optional[int], release_fn) -> None:
        with self._lock:
            self.pending += buf.numel()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lms-host-release", daemon=True)
                self._thread.start()
                atexit.register(self.wait)
        self._q.put((buf, event, device, release_fn))

    def wait(self) -> None:
        if threading.current_thread() is not self._thread:  # (a pool's __del__ there)
            self._q.join()

    def _run(self) -> None:
        current = None
        while True:
            item = self._q.get()
            nbytes = item[0].numel()
            try:
                buf, event, device, release_fn = item
                item = None
                if event is not None:
                    event.synchronize()
                if device is not None:
                    if device != current:
                        # the pool's device, never a context of device 0 created here
                        torch.cuda.set_device(device)
                        current = device
                    if int(torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())) != 0:
                        self.errors += 1
                if release_fn is not None:
                    release_fn(nbytes)
                del buf  # the last reference to its mapping: the pages go back now
            except Exception:  # pragma: no cover - a driver error: counted, not raised
                self.errors += 1
            finally:
                buf = item = None
                with self._lock:
                    self.pending -= nbytes
                self._q.task_done()


_releaser = _Releaser()


def _prefault(buf: torch.Tensor) -> None:
    """Faults in the pages of a fresh mapping from several threads.

    cudaHostRegister of fresh pages has the kernel fault in and zero each one on the
    calling thread, at 1-2 GB/s; written first from 8 threads (one byte a 4 KiB page),
    the same 8.6 GB pinned at 4.1 GB/s in all on the H100 machine (pin_rate.py,
    results/h100-run75).  Its own threads, not PyTorch's intra-op pool, which torchrun
    sets to one thread.  Zeros are written: the buffer reads as the kernel gave it."""
    n = buf.numel()
    if n < (64 << 20):
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    k = max(1, min(8, cpus))
    pages = buf[::4096]
    step = (pages.numel() + k - 1) // k
    threads = [threading.Thread(target=pages[a:a + step].zero_, daemon=True)
               for a in range(step, pages.numel(), step)]
    for t in threads:
        t.start()
    pages[:step].zero_()  # the first share on this thread (PyTorch releases the GIL)
    for t in threads:
        t.join()


class HostPool:
    """Pool of host buffers of exact byte sizes, pinned with ``cudaHostRegister``.

    ``torch.empty(..., pin_memory=True)`` goes through PyTorch's caching host allocator,
    which rounds every request up to a power of two and keeps what it got: up to twice
    the memory for activations.  This pool keeps one free list per exact size (a training
    step asks for the same sizes every time), allocates ordinary host memory of exactly
    the requested size and pins it in place.  With ``pin=False`` (CPU-only machines,
    tests) the buffers are plain host memory and all accounting works the same.

    ``limit`` bounds :attr:`reserved` (bytes held, in use or cached).  Growing past it
    first releases cached free buffers of other sizes; when that is not enough
    :class:`LMSHostMemoryError` is raised.  The pool also refuses to grow when the
    machine would be left with less than ``min_available`` bytes of available memory.
    ``reserve_fn(n)->bool`` / ``release_fn(n)`` (the allocator's shared accounting on a
    patched build) are called when buffers are created and destroyed.

    Between training steps (:meth:`end_step`) the pool gives back the cached buffers that
    none of the last ``keep_steps`` steps handed out: host memory follows need, and what
    any recent step used stays pinned.  Pinning runs at about 2 GB/s (on the H100
    machine), and a step's sizes vary: a Llama at 1.5x swapped its 6.6 GiB fp32 logits
    in two steps of every four; a pool capped at the most one step had in use gave that
    buffer back and pinned it again every cycle (4 s in a 1.7 s step).  Cached buffers
    yield to the limit at once: when the eviction net's host copies (``extra_fn``) and
    what the pool holds exceed it, the next pool operation releases cached buffers,
    least recently returned first.  The net itself counts only the bytes in use here
    (``on_change``): the C++ net cannot wait for Python to release cached buffers, so
    for as long as that takes (until the next allocation or release of a swapped
    tensor) host memory may exceed the limit by at most the cached bytes; the machine's
    ``min_available`` floor holds for both at all times.  Buffers given back are
    unpinned and unmapped on a daemon thread (:class:`_Releaser`); until they are gone
    they count against the limit and the floor.
    """

    def __init__(
        self,
        limit: int,
        pin: bool = True,
        min_available: int = 0,
        reserve_fn=None,
        release_fn=None,
        available_fn=_host_available,
        extra_fn=None,
        on_change=None,
        keep_steps: int = 8,
    ) -> None:
        if limit < 0:
            raise ValueError("host pool limit must be >= 0")
        if keep_steps < 1:
            raise ValueError("host pool keep_steps must be >= 1")
        self.limit = int(limit)
        self.pin = bool(pin)
        self.min_available = int(min_available)
        self._reserve_fn = reserve_fn
        self._release_fn = release_fn
        self._available_fn = available_fn
        self._extra_fn = extra_fn      # host bytes held elsewhere under the same limit
        self._on_change = on_change    # called with `in_use` when it changes
        self.keep_steps = int(keep_steps)
        self._step = 0                 # end_step() calls so far
        self._lock = threading.RLock()
        # nbytes -> deque of (buffer, event or None, key), oldest first; over all sizes,
        # key -> nbytes in the order the buffers came back, and key -> the step they
        # came back in (never decreasing along that order)
        self._free: Dict[int, collections.deque] = {}
        self._free_order: "collections.OrderedDict[int, int]" = collections.OrderedDict()
        self._freed_in: Dict[int, int] = {}
        self._free_bytes = 0
        self._pending: List[tuple] = []
        self._busy = False
        self._ids = 0
        self.reserved = 0
        self.in_use = 0
        self.peak_in_use = 0
        self.peak_reserved = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.blocks = 0
        self.pin_seconds = 0.0
        self._device: Optional[int] = None  # where the buffers were pinned

    # -- public --------------------------------------------------------------------
    def alloc(self, nbytes: int) -> torch.Tensor:
        """A uint8 host tensor of exactly ``nbytes`` bytes (pinned when ``pin``)."""
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError("HostPool.alloc: nbytes must be > 0")
        with self._lock:
            self._flush()
            with self._deferring_frees():
                buf = self._take_free(nbytes)
                if buf is not None:
                    self.hits += 1
                else:
                    self._make_room(nbytes)
                    buf = self._create(nbytes)
                    self.misses += 1
            self.in_use += nbytes
            self.peak_in_use = max(self.peak_in_use, self.in_use)
            self._changed()
            return buf

    def free(self, buf: torch.Tensor, event=None) -> None:
        """Return ``buf``; it is handed out again once ``event`` (if any) completed.

        Safe to call from ``__del__`` at any time (also while this thread is inside
        the pool, e.g. when the garbage collector runs): the buffer is queued and
        taken into the free lists at the next pool operation."""
        self._pending.append((buf, event))  # list.append is atomic
        if self._lock.acquire(blocking=False):
            try:
                if not self._busy:
                    self._flush()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _deferring_frees(self):
        """While the free lists change (the lock held): a buffer returned meanwhile,
        by a ``__del__`` the garbage collector runs on this thread, waits in
        ``_pending`` for the next flush instead of entering the lists mid-change."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    def _flush(self) -> None:
        if not self._pending:
            return
        while self._pending:
            buf, event = self._pending.pop()
            nbytes = buf.numel()
            self.in_use -= nbytes
            self._ids += 1
            key = self._ids
            self._free.setdefault(nbytes, collections.deque()).append((buf, event, key))
            self._free_order[key] = nbytes
            self._freed_in[key] = self._step
            self._free_bytes += nbytes
        self._changed()
        self._trim_to_limit()

    def _trim_to_limit(self) -> int:
        """Releases cached buffers, least recently returned first, while what the pool
        holds and the host memory held elsewhere under the same limit exceed it."""
        if self._extra_fn is None:
            return 0
        released = 0
        extra = self._extra_fn()
        with self._deferring_frees():
            while self._free_order and self.reserved + extra > self.limit:
                released += self._evict_key(next(iter(self._free_order)))
        return released

    def empty_cache(self, wait: bool = True) -> int:
        """Release every cached free buffer (given back once ``wait`` returns); returns
        the bytes released."""
        released = 0
        with self._lock:
            self._flush()
            with self._deferring_frees():
                for key in list(self._free_order):
                    released += self._evict_key(key)
        if wait:
            _releaser.wait()
        return released

    @staticmethod
    def wait_released() -> None:
        """Returns once every buffer the pools gave back is unpinned and unmapped."""
        _releaser.wait()

    def end_step(self) -> int:
        """Called between training steps: gives back the cached buffers that none of
        the last ``keep_steps`` steps handed out (a step that swaps nothing holds
        nothing after ``keep_steps`` more).  Returns the bytes released."""
        released = 0
        with self._lock:
            self._flush()
            self._step += 1
            oldest = self._step - self.keep_steps  # buffers back before that step go
            with self._deferring_frees():
                while self._free_order:
                    key = next(iter(self._free_order))
                    if self._freed_in[key] >= oldest:
                        break
                    released += self._evict_key(key)
            released += self._trim_to_limit()
        return released

    def __del__(self) -> None:
        # unpin what the pool still holds: registered pages handed back to malloc
        # would make a later cudaHostRegister of the same pages fail
        try:
            self.empty_cache(wait=False)
        except Exception:
            pass

    @property
    def cached(self) -> int:
        with self._lock:
            if not self._busy:
                self._flush()
            return self._free_bytes

    def stats(self) -> Dict[str, int]:
        with self._lock:
            if not self._busy:
                self._flush()
            return {
                "host.limit_bytes": self.limit,
                "host.reserved_bytes": self.reserved,
                "host.in_use_bytes": self.in_use,
                "host.cached_bytes": self._free_bytes,
                "host.peak_in_use_bytes": self.peak_in_use,
                "host.peak_reserved_bytes": self.peak_reserved,
                "host.blocks": self.blocks,
                "host.pool_hits": self.hits,
                "host.pool_misses": self.misses,
                "host.evictions": self.evictions,
                "host.pin_ms": int(self.pin_seconds * 1000),
                "host.releasing_bytes": _releaser.pending,
                "host.release_errors": _releaser.errors,
            }

    def reset_peaks(self) -> None:
        with self._lock:
            self.peak_in_use = self.in_use
            self.peak_reserved = self.reserved

    # -- internals -----------------------------------------------------------------
    def _take_free(self, nbytes: int) -> Optional[torch.Tensor]:
        q = self._free.get(nbytes)
        if not q:
            return None
        # the most recently returned buffer whose last copy has finished: steps reuse
        # the same buffers, and those a step no longer needs age out (end_step)
        pick = None
        for i in range(len(q) - 1, -1, -1):
            ev = q[i][1]
            if ev is None or ev.query():
                pick = i
                break
        if pick is None:
            pick = 0
            q[0][1].synchronize()
        buf, _ev, key = q[pick]
        del q[pick]
        if not q:
            del self._free[nbytes]
        del self._free_order[key]
        del self._freed_in[key]
        self._free_bytes -= nbytes
        return buf

    def _evict_key(self, key: int) -> int:
        nbytes = self._free_order.pop(key)
        del self._freed_in[key]
        q = self._free[nbytes]
        for i, (buf, ev, k) in enumerate(q):
            if k == key:
                del q[i]
                break
        else:  # pragma: no cover - internal invariant
            raise AssertionError("host pool free list out of sync")
        if not q:
            del self._free[nbytes]
        self._free_bytes -= nbytes
        self.reserved -= nbytes
        self.blocks -= 1
        self.evictions += 1
        _releaser.put(buf, ev, self._device if self.pin else None, self._release_fn)
        self._changed()
        return nbytes

    def _held(self) -> int:
        """Bytes held under the limit: the pool's, and those it gave back that are not
        yet unpinned and unmapped."""
        return self.reserved + _releaser.pending

    def _give_way(self) -> bool:
        """Makes host room: releases the least recently returned cached buffer, else
        waits for the buffers being given back.  False when there is neither."""
        if self._free_order:
            self._evict_key(next(iter(self._free_order)))
        elif _releaser.pending:
            _releaser.wait()
        else:
            return False
        return True

    def _make_room(self, nbytes: int) -> None:
        # 1. our own limit (shared with the eviction net's host copies)
        extra = self._extra_fn() if self._extra_fn is not None else 0
        while self._held() + extra + nbytes > self.limit:
            if not self._give_way():
                raise LMSHostMemoryError(
                    f"LMS: host swap space exhausted: {_fmt(nbytes)} more would exceed "
                    f"the host memory limit of {_fmt(self.limit)} ({_fmt(self.in_use)} in "
                    f"use by swapped tensors). Raise {ENV_HOST_LIMIT} (MiB) or "
                    f"host_limit=..., lower the batch size, or combine swapping with "
                    f"torch.utils.checkpoint."
                )
        # 2. the machine
        if self.min_available > 0 and self._available_fn is not None:
            avail = self._available_fn()
            while avail is not None and avail - nbytes < self.min_available:
                if not self._give_way():
                    raise LMSHostMemoryError(
                        f"LMS: host memory nearly exhausted: {_fmt(nbytes)} more swap "
                        f"space would leave {_fmt(avail - nbytes)} available on this "
                        f"machine (keeping at least {_fmt(self.min_available)} free so the "
                        f"OOM killer does not end the process); {_fmt(self.in_use)} in use "
                        f"by swapped tensors, limit {_fmt(self.limit)}. Lower the batch "
                        f"size or free host memory."
                    )
                avail = self._available_fn()
        # 3. the allocator's shared budget (patched build)
        if self._reserve_fn is not None:
            while not self._reserve_fn(nbytes):
                if not self._give_way():
                    raise LMSHostMemoryError(
                        f"LMS: host memory limit shared with the CUDA allocator's LMS "
                        f"reached: cannot reserve {_fmt(nbytes)} more swap space "
                        f"({_fmt(self.reserved)} held by activation swapping). Raise "
                        f"{ENV_HOST_LIMIT} (MiB) or lower the batch size."
                    )

    def _create(self, nbytes: int) -> torch.Tensor:
        # Each buffer is its own anonymous mapping: destroying it gives the pages back to
        # the kernel at once (heap memory would stay in the process), and whole pages
        # belong to this buffer only (cudaHostRegister fails on a page registered twice).
        length = (nbytes + _PAGE - 1) // _PAGE * _PAGE
        try:
            try:
                mem = mmap.mmap(-1, length)
            except (OSError, ValueError) as e:
                raise LMSHostMemoryError(
                    f"LMS: cannot map {_fmt(nbytes)} of host memory for swap space ({e}); "
                    f"{_fmt(self.reserved)} already held") from None
            if self.pin and hasattr(mem, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
                # 2 MiB pages where the kernel has them: fewer pages to fault in and pin
                try:
                    mem.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
            buf = torch.frombuffer(mem, dtype=torch.uint8, count=nbytes)
            if self.pin:
                t0 = time.perf_counter()
                _prefault(buf)
                if self._device is None:
                    self._device = torch.cuda.current_device()
                rt = torch.cuda.cudart()
                err = rt.cudaHostRegister(buf.data_ptr(), length, 0)
                self.pin_seconds += time.perf_counter() - t0
                if int(err) != 0:
                    clear = getattr(rt, "cudaGetLastError", None)
                    if clear is not None:
                        clear()
                    raise LMSHostMemoryError(
                        f"LMS: cudaHostRegister of {_fmt(nbytes)} failed (error "
                        f"{int(err)}); {_fmt(self.reserved)} already pinned for swapping."
                    )
        except BaseException:
            if self._reserve_fn is not None and self._release_fn is not None:
                self._release_fn(nbytes)
            raise
        self.reserved += nbytes
        self.blocks += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._changed()
        return buf

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.in_use)
