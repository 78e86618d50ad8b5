"""Pinned host memory for the swap pool: mapping and pinning it fast, and giving it
back on a thread of its own."""

from __future__ import annotations

import atexit
import mmap
import os
import queue
import sys
import threading
from typing import Optional

import torch

__all__ = ["PAGE", "map_host", "releaser"]

try:
    PAGE = max(4096, int(os.sysconf("SC_PAGE_SIZE")))
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    PAGE = 4096


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
    before it reports a limit reached, and :attr:`on_pending` (the eviction net's
    ``add_releasing``, once loaded) hears every change, so that the net counts them too.
    Nothing queued here is used again."""

    def __init__(self) -> None:
        self._q: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._device: Optional[int] = None  # the device the releasing thread made current
        self.pending = 0
        self.errors = 0
        self.on_pending = None  # called with each change of `pending` (bytes)

    def set_on_pending(self, hook) -> None:
        """Installs ``hook`` (None removes it): it first hears what is pending now, and
        a hook it replaces hears that gone (every swapper's pool installs the net's:
        installed again, it must not count the pending bytes twice)."""
        with self._lock:
            if hook is self.on_pending:
                return
            old, self.on_pending = self.on_pending, hook
            if self.pending:
                if old is not None:
                    old(-self.pending)
                if hook is not None:
                    hook(self.pending)

    def _note(self, delta: int) -> None:
        self.pending += delta
        hook = self.on_pending
        if hook is not None:
            hook(delta)

    def put(self, buf: torch.Tensor, event, device: Optional[int], release_fn) -> None:
        item = (buf, event, device, release_fn)
        with self._lock:
            self._note(buf.numel())
            if self._thread is None and sys.is_finalizing():
                # a pool's __del__ at interpreter exit: no thread can start any more
                # (Thread.start would wait for it forever), so the buffer goes back here
                inline = True
            else:
                inline = False
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="lms-host-release", daemon=True)
                    self._thread.start()
                    atexit.register(self.wait)
        if inline:
            self._release([item])
        else:
            self._q.put(item)

    def wait(self) -> None:
        if threading.current_thread() is not self._thread:  # (a pool's __del__ there)
            self._q.join()

    def _run(self) -> None:
        while True:
            box = [self._q.get()]
            try:
                self._release(box)
            finally:
                self._q.task_done()

    def _release(self, box: list) -> None:
        """Gives back the buffer queued in ``box`` (taken out of it, so that the last
        reference is dropped here): unpin, then unmap; a driver error is counted, not
        raised."""
        item = box.pop()
        nbytes = item[0].numel()
        try:
            buf, event, device, release_fn = item
            item = None
            if event is not None:
                event.synchronize()
            if device is not None:
                if device != self._device:
                    # the pool's device, never a context of device 0 created here
                    torch.cuda.set_device(device)
                    self._device = device
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
                self._note(-nbytes)


releaser = _Releaser()


def _prefault(buf: torch.Tensor) -> None:
    """Faults in the pages of a fresh mapping from several threads.

    cudaHostRegister of fresh pages has the kernel fault in and zero each one on the
    calling thread, at 1-2 GB/s; written first from 8 threads (one byte a 4 KiB page),
    the same 8.6 GB pinned at 4.1 GB/s in all on the H100 machine (pin_rate.py,
    records/runs.jsonl, run 75).  Its own threads, not PyTorch's intra-op pool, which torchrun
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


def map_host(length: int, pin: bool) -> torch.Tensor:
    """A uint8 tensor over a fresh anonymous mapping of ``length`` bytes (a multiple of
    the page size), pinned in place with ``cudaHostRegister`` when ``pin``.

    Its own mapping: destroying it gives the pages back to the kernel at once (heap
    memory would stay in the process), and its pages belong to it only
    (cudaHostRegister fails on a page registered twice).  Raises ``OSError`` when the
    mapping fails and ``RuntimeError`` with the CUDA error code when pinning does."""
    mem = mmap.mmap(-1, length)
    if pin and hasattr(mem, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        # 2 MiB pages where the kernel has them: fewer pages to fault in and pin
        try:
            mem.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    buf = torch.frombuffer(mem, dtype=torch.uint8, count=length)
    if pin:
        _prefault(buf)
        rt = torch.cuda.cudart()
        err = int(rt.cudaHostRegister(buf.data_ptr(), length, 0))
        if err != 0:
            clear = getattr(rt, "cudaGetLastError", None)
            if clear is not None:
                clear()
            raise RuntimeError(f"cudaHostRegister failed (error {err})")
    return buf
