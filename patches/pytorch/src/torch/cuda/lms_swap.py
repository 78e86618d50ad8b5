r"""On-demand activation swapping with prefetch (Large Model Support, Python layer).

Autograd knows which tensors the backward pass will need and in which order: the
tensors saved in forward come back in (roughly) reverse order.  This module uses
:class:`torch.autograd.graph.saved_tensors_hooks` to move saved activations to pinned
host memory *only when the device is short of memory*, and to bring them back ahead of
use in backward.

Compared with :class:`torch.autograd.graph.save_on_cpu` it

* does nothing while the device has room: tensors are only swapped when the device
  allocation is near a limit (cheap, sparse checks of ``torch.cuda.memory_allocated``),
  and tensors smaller than ``size_threshold`` are never touched;
* learns from a step that needed swapping to swap the earliest activations of the next
  one (longest time until backward needs them again), and leaves the last ones forward
  saves on the device while the allocation is under the limit (backward needs them
  first: swapping them costs a round trip and does not lower backward's peak);
* copies device -> host on a side stream (the forward pass goes on) and frees the device
  memory as soon as the copy has finished (``Tensor.record_stream``), with the CPU
  throttled so that not more than ``max_inflight_bytes`` wait for a copy;
* copies host -> device on a second side stream, prefetching the next tensors backward
  will need (``prefetch_depth`` of them, within the device memory that is free);
* keeps strides (channels_last stays channels_last; values and layout are restored byte
  for byte, so gradients are bitwise equal to a run without swapping);
* copies a tensor that autograd saved twice (e.g. the output of an in-place ReLU that
  the next convolution saves as its input) only once;
* keeps a net under its forecast: every tensor it leaves on the device stays evictable,
  and when the caching allocator runs out of memory anyway (a transient larger than any
  seen, a first step that needs 2x), the net moves those tensors to host memory and the
  allocation is retried (``guard``, below); the next steps learn from what it moved;
* uses an exact-size pool of pinned host buffers (no power-of-two rounding) under a host
  memory limit, and raises :class:`LMSHostMemoryError` (a ``torch.OutOfMemoryError``)
  before the machine runs out of memory; when swap space is full, a tensor stays on
  the device as long as the device allocation is under its limit, and the error is
  raised only when neither has room.

Use, on a PyTorch built with the LMS patch::

    torch.cuda.set_enabled_lms(True)      # allocator LMS + this layer (calls enable())

on any PyTorch >= 2.4 (this file imported on its own, see examples/pytorch/lms_swap_loader.py)::

    lms_swap.enable()                     # for the calling thread, until disable()
    with lms_swap.swapping(prefetch_depth=4):   # or scoped
        loss = model(x).sum()
    loss.backward()

Run with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` when swapping a lot: the
caching allocator's fixed segments fragment when big tensors are freed out of order
(seen on an H100: 19 GiB reserved but unusable, then an out-of-memory error).

Tunables (keyword arguments of :func:`enable`, :func:`configure`, :func:`swapping`):

``policy``
    ``"auto"`` (swap under memory pressure, the default), ``"always"`` (swap every
    eligible tensor; for tests and measurements) or ``"never"``.
``size_threshold``
    tensors smaller than this many bytes stay on the device (default 1 MiB; env
    ``PYTORCH_LMS_SWAP_THRESHOLD_IN_KB``).
``device_limit``
    bytes of device memory the caching allocator may hold allocated before tensors are
    swapped.  Default: the allocator's LMS limit on a patched build when it is set, else
    ``device_limit_fraction`` of the device's total memory when that is set, else, with
    the eviction net (``guard``), 99% of the memory the caching allocator can have (free
    plus reserved when first measured: a forecast that aims too high costs an eviction,
    not the job), and without the net 98% of the device's total memory.
``margin``
    bytes kept free at the end of forward for backward: forward swaps so that it ends
    this far under the limit.  Default: learned (``adaptive_margin``, default True) as
    backward's peak over forward's end, from every step (exactly with the eviction
    net, which keeps a running peak of its own; without it from a step whose backward
    set a new ``max_memory_allocated``, else only ever lowered by that bound), plus a
    slack learned from steps that moved memory and still made the caching allocator
    release cached memory to serve a request (``next_slack``), never under
    ``min_margin_factor`` times the largest saved tensor (default: 1 without the
    eviction net, 0 with it: a margin learned too low then costs an eviction, and a
    floor of one ResNet-50 activation made it swap 3.3 GiB a step at a batch stock
    PyTorch trains) nor ``min_margin``.  The first step has nothing to learn from:
    with the eviction net it keeps only ``min_margin`` until the net first has to
    move something (a step that fits, as at a batch stock PyTorch trains, swaps
    nothing and pins no host memory); from then on, and throughout without the net or
    when ``first_margin_fraction`` is set, it keeps ``margin_factor`` (5) times the
    largest saved tensor or ``first_margin_fraction`` (default 0.35) of the limit,
    whichever is more (a language model's largest tensors come last, in its loss).
``prefetch_reserve_factor``
    backward's prefetching fills device memory only up to forward's end and up to the
    limit less the margin and less this many (default 3) times the largest saved
    tensor (raised by a quarter after a step whose backward the eviction net had to
    rescue, or without the net whose backward went over the limit; never lowered:
    backward's biggest allocations, e.g. ResNet-50's first layers allocating twice
    their largest activation in fp32, come at moments no measurement at other moments
    predicts).
``plan``
    (default True) learn from each step how many bytes had to be swapped and, in the
    next step, swap that much from the *start* of forward: the copies out then overlap
    forward, and backward, which needs those tensors last, has all its time to bring
    them back.  The pressure rule stays on as a safety net.
``prefetch_depth``
    at most this many swapped tensors are fetched ahead of backward (default 48); the
    real depth adapts to memory: prefetching stops where the device allocation would go
    over forward's end or over the limit less the prefetch headroom (see
    ``prefetch_reserve_factor``).  (On the H100, GPT-2 at 1.5x its largest stock batch
    swaps ~10 tensors per layer: with 16 the copies in ran 1.5 layers ahead, the compute
    stream waited for them 70% of backward, and the step took 2.44 s; with 48, 2.24 s.)
``max_inflight_bytes``
    device bytes that may wait for a device->host copy before forward waits
    (default 1 GiB or the largest tensor seen, whichever is more); under memory
    pressure forward waits for every earlier copy before it goes on.
``host_limit``
    bytes of pinned host memory for swap space, per process.  Default: env
    ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` (shared with the allocator's host spill), else
    80% of the machine's RAM, shared equally by the processes on the node
    (:func:`local_world_size`: torchrun's ``LOCAL_WORLD_SIZE``).  On a patched build the
    allocator's ``torch.cuda.lms._host_reserve``/``_host_release`` account the same
    budget.
``host_min_available``
    the pool does not grow when the machine would be left with less available memory
    than this (default max(2 GiB, 5% of RAM)).
``guard``
    (default True) register every tensor the policy keeps on the device with the
    eviction net (``lms_swap_guard.cpp``, compiled once on first use; without a C++
    compiler or CUDA headers swapping runs without it and warns): when the caching
    allocator raises out-of-memory, the net copies kept tensors to host memory, earliest
    saved first, frees them and retries the allocation, so a wrong forecast costs a
    round trip instead of the job.  What it did is in :func:`stats` (``guard.*``,
    ``swap.guard_*``) and is learned from: evictions in forward raise the next plan,
    evictions in backward the margin.
``trace``
    record ``(time, event, device bytes allocated, host bytes in use)`` per pack and
    unpack into :func:`trace` (costs a memory query per event).

The hooks are per thread (as all saved-tensor hooks are): call :func:`enable` in the
thread that runs forward.  Backward may run in autograd's threads; that is handled.

Left on the device (never swapped): tensors under ``size_threshold``; parameters and
other leaves that require grad; tensor subclasses; non-strided layouts; views with
gaps or overlap (``x[:, ::2]``, ``expand``), and views covering less than half of their
storage (swapping them would not free the storage).  Dense views (transposes,
permutes, channels_last) are swapped with their strides.  An in-place change of a
swapped tensor after it was saved raises the same error as stock autograd at
``backward`` (detected while the saved tensor's Python object is alive).  Regions under
other saved-tensor hooks (``torch.utils.checkpoint``) are left to those hooks.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import contextlib
import importlib
import mmap
import os
import queue
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = [
    "LMSHostMemoryError",
    "HostPool",
    "SwapConfig",
    "ActivationSwapper",
    "enable",
    "disable",
    "is_enabled",
    "configure",
    "swapping",
    "stats",
    "reset_stats",
    "trace",
    "empty_cache",
    "get_swapper",
    "host_mem_limit_from_env",
    "local_world_size",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

ENV_HOST_LIMIT = "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB"
ENV_THRESHOLD = "PYTORCH_LMS_SWAP_THRESHOLD_IN_KB"


_OutOfMemoryError = (getattr(torch, "OutOfMemoryError", None)          # torch >= 2.5
                     or getattr(torch.cuda, "OutOfMemoryError", None)     # older
                     or RuntimeError)


class LMSHostMemoryError(_OutOfMemoryError):
    """Raised when swap space in pinned host memory would exceed its limit (a
    ``torch.OutOfMemoryError``, so code that handles out-of-memory handles it too).
    Under ``torchrun`` the message names the rank and how many processes share the
    node's host memory."""

    def __init__(self, message: str) -> None:
        super().__init__(message + _rank_note())


def local_world_size() -> int:
    """Processes that share this node's host memory: torchrun's ``LOCAL_WORLD_SIZE``
    (1 when it is unset or not a positive integer)."""
    raw = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _rank_note() -> str:
    rank = os.environ.get("RANK")
    if rank is None:
        return ""
    return (f" (rank {rank}, local rank {os.environ.get('LOCAL_RANK', '?')} of "
            f"{local_world_size()} processes sharing this node's host memory; the limit "
            f"is per process)")


# --------------------------------------------------------------------------------------
# host memory facts
# --------------------------------------------------------------------------------------
def _meminfo() -> Dict[str, int]:
    """/proc/meminfo in bytes ({} where unavailable)."""
    out: Dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    mult = 1024 if len(parts) > 2 and parts[2] == "kB" else 1
                    out[parts[0].rstrip(":")] = int(parts[1]) * mult
    except OSError:
        pass
    return out


def _host_total() -> int:
    return _meminfo().get("MemTotal", 0)


def _host_available() -> Optional[int]:
    return _meminfo().get("MemAvailable")


def host_mem_limit_from_env() -> Optional[int]:
    """Bytes given by ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB``, None when unset.

    Raises ValueError for a value that is not a non-negative number.
    """
    raw = os.environ.get(ENV_HOST_LIMIT)
    if raw is None or raw.strip() == "":
        return None
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(
            f"{ENV_HOST_LIMIT}={raw!r}: expected a number of MiB (e.g. 65536)"
        ) from None
    if mb < 0:
        raise ValueError(f"{ENV_HOST_LIMIT}={raw!r}: must not be negative")
    return int(mb * MiB)


def _threshold_from_env() -> Optional[int]:
    raw = os.environ.get(ENV_THRESHOLD)
    if raw is None or raw.strip() == "":
        return None
    try:
        kb = float(raw)
    except ValueError:
        raise ValueError(
            f"{ENV_THRESHOLD}={raw!r}: expected a number of KiB (e.g. 1024)"
        ) from None
    return int(kb * KiB)


def _fmt(n: Optional[float]) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _allocator_lms() -> Any:
    """``torch.cuda.lms`` on a patched build, else None (never raises)."""
    mod = getattr(torch.cuda, "lms", None)
    if mod is not None and not callable(mod):
        return mod
    try:
        return importlib.import_module("torch.cuda.lms")
    except Exception:
        return None


# --------------------------------------------------------------------------------------
# the eviction net (lms_swap_guard.cpp): the kept tensors' way out when the forecast fails
# --------------------------------------------------------------------------------------
GUARD_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lms_swap_guard.cpp")
_guard_state: Dict[str, Any] = {}
_guard_lock = threading.Lock()


def _cuda_include_dirs() -> List[str]:
    """Where the CUDA runtime headers are: a CUDA toolkit, else NVIDIA's wheels (the
    runtime wheel, which PyTorch's CUDA wheels depend on, has ``cuda_runtime_api.h``; the
    ``crt/`` headers it includes come with the compiler wheel, nvidia-cuda-nvcc-cu12, or
    nvidia-cuda-crt for CUDA 13)."""
    dirs = []
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # pragma: no cover - broken torch install
        CUDA_HOME = None
    for root in filter(None, (CUDA_HOME, os.environ.get("CUDA_HOME"))):
        dirs.append(os.path.join(root, "include"))
    for base in sys.path:
        for sub in ("nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include",
                    "nvidia/cu13/include", "nvidia/cu12/include"):
            dirs.append(os.path.join(base, sub))
    return [d for d in dict.fromkeys(dirs)
            if any(os.path.isfile(os.path.join(d, h))
                   for h in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h")))]


def build_guard(verbose: bool = False) -> Any:
    """Compiles (once per PyTorch version; cached in ``TORCH_EXTENSIONS_DIR``) and imports
    the eviction net.  Needs a C++ compiler, ninja and the CUDA runtime headers, not a
    GPU; raises where it cannot be built.  :func:`load_guard` is what the swapper uses."""
    from torch.utils import cpp_extension
    inc = _cuda_include_dirs()
    for header in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h")):
        if not any(os.path.isfile(os.path.join(d, header)) for d in inc):
            # NVIDIA's wheel with the crt/ headers: CUDA 12's compiler wheel, CUDA 13's own
            wheel = ("nvidia-cuda-crt" if (torch.version.cuda or "").startswith("13")
                     else "nvidia-cuda-nvcc-cu12")
            raise RuntimeError(
                f"the CUDA runtime headers are incomplete ({header} not found): install a "
                f"CUDA toolkit and set CUDA_HOME, or `pip install {wheel}` of CUDA "
                f"{torch.version.cuda}")
    return cpp_extension.load(
        name="lms_swap_guard_" + torch.__version__.replace(".", "_").replace("+", "_"),
        sources=[GUARD_SOURCE], extra_include_paths=inc,
        extra_cflags=["-O2"], verbose=verbose)


def load_guard(required: bool = False) -> Any:
    """The compiled eviction net (built once per PyTorch version with
    ``torch.utils.cpp_extension``; cached in ``TORCH_EXTENSIONS_DIR``), or None where it
    cannot be built (no C++ compiler, no CUDA headers, no CUDA): swapping then runs on
    its forecast alone, and :func:`stats` says so (``guard.active`` 0).  ``required``
    raises instead."""
    with _guard_lock:
        if "module" in _guard_state:
            mod = _guard_state["module"]
            if mod is None and required:
                raise RuntimeError(_guard_state.get("error", "LMS guard unavailable"))
            return mod
        mod, err = None, None
        try:
            if not torch.cuda.is_available():
                raise RuntimeError("CUDA is not available")
            mod = build_guard()
        except Exception as e:  # the job goes on without the net; stats show it
            err = f"LMS activation swapping: eviction net not built ({type(e).__name__}: {e})"
            warnings.warn(err + "; a wrong forecast can then end in CUDA out of memory",
                          RuntimeWarning, stacklevel=3)
        _guard_state["module"], _guard_state["error"] = mod, err
        if mod is None and required:
            raise RuntimeError(err)
        return mod


# --------------------------------------------------------------------------------------
# exact-size pinned host pool
# --------------------------------------------------------------------------------------
try:
    _PAGE = max(4096, int(os.sysconf("SC_PAGE_SIZE")))
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    _PAGE = 4096


class _Releaser:
    """Unpins and unmaps the host pool's buffers on one daemon thread.

    Giving back 20 GB of pinned buffers (``cudaHostUnregister``, then the unmap) took
    2.4 s on the H100 machine; done inline it stalled the step whose end aged them out.
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
    ``min_available`` floor holds for both at all times.
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
            self._busy = True
            try:
                buf = self._take_free(nbytes)
                if buf is not None:
                    self.hits += 1
                else:
                    self._make_room(nbytes)
                    buf = self._create(nbytes)
                    self.misses += 1
            finally:
                self._busy = False
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
        busy, self._busy = self._busy, True
        try:
            while self._free_order and self.reserved + extra > self.limit:
                released += self._evict_key(next(iter(self._free_order)))
        finally:
            self._busy = busy
        return released

    def empty_cache(self, wait: bool = True) -> int:
        """Release every cached free buffer (given back once ``wait`` returns); returns
        the bytes released."""
        released = 0
        with self._lock:
            self._flush()
            self._busy = True
            try:
                for key in list(self._free_order):
                    released += self._evict_key(key)
            finally:
                self._busy = False
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
            self._busy = True
            try:
                while self._free_order:
                    key = next(iter(self._free_order))
                    if self._freed_in[key] >= oldest:
                        break
                    released += self._evict_key(key)
            finally:
                self._busy = False
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


# --------------------------------------------------------------------------------------
# configuration and policy
# --------------------------------------------------------------------------------------
class SwapConfig:
    """Tunables of :class:`ActivationSwapper` (see the module docstring)."""

    _fields = {
        "policy": "auto",
        "size_threshold": 1 * MiB,
        "device_limit": None,
        "device_limit_fraction": None,
        "margin": None,
        "margin_factor": 5.0,
        "adaptive_margin": True,
        "min_margin": 512 * MiB,
        "min_margin_factor": None,
        "first_margin_fraction": None,
        "prefetch_reserve_factor": 3.0,
        "prefetch_depth": 48,
        "max_inflight_bytes": 1 * GiB,
        "query_every": 8,
        "plan": True,
        "host_limit": None,
        "host_min_available": None,
        "dedupe": True,
        "min_storage_fraction": 0.5,
        "trace": False,
        "guard": True,
        "device_type": "cuda",
    }

    def __init__(self, **kw: Any) -> None:
        for k, v in self._fields.items():
            setattr(self, k, v)
        env_thr = _threshold_from_env()
        if env_thr is not None:
            self.size_threshold = env_thr
        self.update(**kw)

    def update(self, **kw: Any) -> "SwapConfig":
        for k, v in kw.items():
            if k not in self._fields:
                raise TypeError(
                    f"unknown LMS swap option {k!r}; known: {', '.join(sorted(self._fields))}"
                )
            setattr(self, k, v)
        self.validate()
        return self

    def validate(self) -> None:
        if self.policy not in ("auto", "always", "never"):
            raise ValueError(f"policy must be 'auto', 'always' or 'never', not {self.policy!r}")
        if int(self.size_threshold) < 0:
            raise ValueError("size_threshold must be >= 0 bytes")
        if self.device_limit_fraction is not None \
                and not (0.0 < float(self.device_limit_fraction) <= 1.0):
            raise ValueError("device_limit_fraction must be in (0, 1]")
        if self.first_margin_fraction is not None \
                and not (0.0 <= float(self.first_margin_fraction) < 1.0):
            raise ValueError("first_margin_fraction must be in [0, 1)")
        if float(self.margin_factor) < 0 or float(self.min_margin_factor or 0) < 0 \
                or float(self.prefetch_reserve_factor) < 0:
            raise ValueError("margin_factor, min_margin_factor and prefetch_reserve_factor "
                             "must be >= 0")
        if self.device_limit is not None and int(self.device_limit) <= 0:
            raise ValueError("device_limit must be > 0 bytes")
        if int(self.prefetch_depth) < 0:
            raise ValueError("prefetch_depth must be >= 0")
        if int(self.max_inflight_bytes) <= 0:
            raise ValueError("max_inflight_bytes must be > 0")
        if self.host_limit is not None and int(self.host_limit) < 0:
            raise ValueError("host_limit must be >= 0 bytes")
        if int(self.query_every) < 1:
            raise ValueError("query_every must be >= 1")
        if self.device_type not in ("cuda", "cpu"):
            raise ValueError("device_type must be 'cuda' (or 'cpu' for tests)")

    def as_dict(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in self._fields}


def _dense_span(t: torch.Tensor) -> bool:
    """True when t's elements fill [storage_offset, storage_offset + numel) exactly
    once (contiguous in some order of dimensions: contiguous, channels_last,
    transposes, permutes); False for gaps (slices with steps) or overlap (expand)."""
    if t.is_contiguous():
        return True
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.size()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage under ``t``, as the elements of the tensor that owns it
    (``t`` itself, or the base of a view).  Not ``t.untyped_storage().nbytes()``: on
    torch 2.11 the Python storage object that call makes stays attached to the storage
    as a second owner for as long as the storage lives, and the eviction net moves only
    tensors whose storage has no other owner (measured on the H100: every kept tensor
    was skipped)."""
    root = t._base if t._base is not None else t
    return root.numel() * root.element_size()


def swap_trigger(device_limit: int, margin: int) -> int:
    """Device bytes allocated above which forward swaps what it saves: the limit less
    the room backward needs on top of what forward leaves (``margin``).  Tensors that
    wait for their copy to the host are bounded separately (``max_inflight_bytes``:
    forward waits for copies beyond it)."""
    return int(device_limit) - int(margin)


def should_swap(nbytes: int, allocated: int, device_limit: int, margin: int) -> bool:
    """The pressure rule: swap a saved tensor of ``nbytes`` when the device allocation
    (which already holds it) plus as much again (the next layer's output is usually of
    that size) is above :func:`swap_trigger`.  (Measured on the H100: without the second
    ``nbytes`` forward ran ~4 GiB further and ResNet-50 at 1.5x ran out of memory.)"""
    return allocated + nbytes > swap_trigger(device_limit, margin)


def in_tail(saved_before: int, nbytes: int, prev_saved: Optional[int], largest: int) -> bool:
    """Whether a tensor is one of the last that forward saves, by the previous step:
    less than ``largest`` bytes were saved after its position (``saved_before`` bytes
    saved before it in this forward, ``prev_saved`` in the whole previous forward; None
    while no forward has ended).  Backward needs these tensors first, so swapping them
    under pressure frees their device memory only from the end of forward until
    backward fetches them again at once, and cannot lower backward's peak.  (GPT-2 on
    the H100 at stock's largest batch: one 3.5 GB loss chunk went out at the end of
    every forward and came back on demand at the start of backward, and the step ran at
    70-76% of stock.)"""
    if prev_saved is None:
        return False
    return int(prev_saved) - (int(saved_before) + int(nbytes)) < int(largest)


def growth_to_end(offsets: List[int], unswapped: List[int], forward_end: int,
                  swapped: int) -> List[int]:
    """What a step taught about the rest of its forward: for each point where the
    allocation was read (``offsets[i]`` bytes saved so far, ``unswapped[i]`` = device
    allocation plus the bytes swapped so far), how much more the allocation would grow
    until forward's end without further swapping (``forward_end`` + ``swapped`` at the
    end, less ``unswapped[i]``; negative where transients end: a language model's loss
    frees its logits)."""
    end = int(forward_end) + int(swapped)
    return [end - int(u) for u in unswapped]


def predict_forward_end(allocated: int, offset: int, prev_offsets: List[int],
                        prev_growth: List[int], prev_saved: Optional[int]) -> Optional[int]:
    """The device allocation at forward's end if nothing more were swapped, by the
    previous step (:func:`growth_to_end`) at the last point it read at or before
    ``offset`` bytes saved; None when it has no such point or this forward has saved
    more than the previous one did (``prev_saved``)."""
    if prev_saved is None or offset > prev_saved or not prev_offsets:
        return None
    i = bisect.bisect_right(prev_offsets, offset) - 1
    if i < 0:
        return None
    return int(allocated) + int(prev_growth[i])


def next_plan(swapped: int, forward_end: int, trigger: int, slack: int,
              peak_over: Optional[int] = None) -> int:
    """Bytes to swap from the *start* of the next forward.

    Swapping the first tensors of forward is best: their copy out overlaps the rest of
    forward and backward needs them last, so their copy in overlaps backward.  This step
    swapped ``swapped`` bytes and ended forward with ``forward_end`` bytes allocated
    (the caching allocator stops counting a swapped tensor when forward drops it, even
    while its copy to the host still runs): keeping the end of forward ``slack`` under
    the trigger needs ``swapped + end - trigger + slack`` bytes swapped (too much
    swapping shows as an end below the trigger and lowers the plan).  (An earlier
    version also subtracted the bytes still in flight; that counted them twice, and on
    the H100 the plan fell to 0 at 1.25x and the next step ran out of memory.)

    ``peak_over`` is how far forward's own peak went over (negative: stayed under) what
    the caching allocator can have, after this step's swapping and the eviction net's
    moves (both in ``swapped``).  Where a transient near forward's end (a language
    model's logits and loss) is forward's highest point, an end under the trigger says
    nothing about it: the plan follows whichever of the two is nearer its bound, so a
    step the net had to rescue in forward swaps what the net moved from the start of
    the next (None: no peak measured, the end alone decides)."""
    need = int(forward_end) - int(trigger)
    if peak_over is not None:
        need = max(need, int(peak_over))
    return max(0, int(swapped) + need + int(slack))


def learn_margin(
    forward_end: int,
    peak_before: int,
    peak_after: int,
    min_margin: int,
) -> int:
    """Backward's own memory need, learned after a step.

    ``forward_end`` is the device allocation at the end of forward.  Backward's peak less
    that is what backward needed on top of it (its gradients and workspaces, and what
    prefetching brought back early): exact when the step's backward set a new peak
    (``peak_after > peak_before``), an upper bound otherwise.  With 5% added, never
    below ``min_margin``.  (The level prefetching filled memory to is not a better
    base: backward's peak comes at another moment, and on the H100 a margin learned
    from it fell to a third of the largest tensor, then the next step ran out of
    memory.)"""
    extra = max(0, int(peak_after) - int(forward_end))
    return max(int(min_margin), int(extra * 1.05))


def damped(learned: float, previous: Optional[float], keep: float = 0.5) -> float:
    """What a step's lesson may lower a learned quantity to: not below ``keep`` times
    its previous value (None: nothing learned yet).  Raising is never damped.  One odd
    step (a short last batch, an eval pass, a step after the eviction net moved
    memory) then cannot undo what the steps before it learned: on an H100 a Llama-style
    decoder's plan fell from 24.4 to 8.8 GiB and its margin from 27 to 4.4 GiB after
    one step, and the next step ran out of memory."""
    if previous is None:
        return learned
    return max(learned, keep * previous)


def next_reserve_factor(current: float, peak: int, limit: int) -> float:
    """The prefetch headroom, as a multiple of the largest saved tensor, after a step
    whose backward set a new ``peak``: a quarter more when that peak went over
    ``limit``, else unchanged.  Never lowered, capped at 8."""
    k = float(current)
    if peak > limit:
        k *= 1.25
    return min(8.0, k)


def next_slack(current: int, released: bool, swapped: int, limit: int) -> int:
    """Device bytes kept free on top of the learned margin, after a step.

    A step that moved memory (swapped, or the net evicted) and in which the caching
    allocator still had to release cached segments to serve a request ran the
    allocator to its edge: each such retry synchronises the device and remaps what it
    gave back (0.1 s each for a UNet at 1.5x on the H100, 5 of them a step with the
    exact margin), while a GiB more swapped costs some 40 ms of copies that overlap
    compute.  Raise by a 64th of the limit (at least 256 MiB), up to a 16th; never
    lowered.  A step that moved less than a 16th of the limit (``swapped`` bytes) is
    left alone: at a batch stock PyTorch trains, the retries are stock's own (ViT-L
    there retries once a step, stock as well), and a slack learned from them doubled
    what it swapped and pinned (4 GiB a step, host RSS 4.2 GiB over stock's)."""
    cur = max(0, int(current))
    if released and swapped >= int(limit) // 16:
        cur = min(int(limit) // 16, cur + max(256 * MiB, int(limit) // 64))
    return cur


def next_margin_factor(
    current: Optional[float],
    largest: int,
    forward_end: int,
    peak_before: int,
    peak_after: int,
    min_margin: int,
    min_factor: float = 0.0,
) -> float:
    """The margin, as a multiple of the largest saved tensor, for the next step.

    A step whose backward set a new peak measured backward's need exactly: take it, up
    or down.  Otherwise the peak is older and only bounds this step's need from above:
    lower the factor to it, never raise it (``current`` None: nothing learned yet).
    Never below ``min_factor``."""
    need = learn_margin(forward_end, peak_before, peak_after, min_margin)
    k = need / max(1, int(largest))
    if current is not None and peak_after <= peak_before:
        k = min(float(current), k)
    return max(float(min_factor), k)


# --------------------------------------------------------------------------------------
# the swapper
# --------------------------------------------------------------------------------------
class _Swapped:
    """What autograd holds for a swapped tensor (the packed object)."""

    __slots__ = (
        "owner", "nbytes", "size", "stride", "dtype", "device", "host",
        "d2h_event", "gpu", "gpu_stream", "h2d_event", "refs", "unpacks", "index",
        "orig", "version", "pass_id", "slot", "__weakref__",
    )

    @classmethod
    def of(cls, owner: Any, t: torch.Tensor, nbytes: int, host: Optional[torch.Tensor] = None,
           slot: Any = None) -> "_Swapped":
        """The handle of ``t``: swapped to ``host``, or kept on the device in ``slot``."""
        h = cls()
        h.owner = owner  # from here on, dropping h returns the host buffer
        h.host, h.slot = host, slot
        h.nbytes = nbytes
        h.size, h.stride, h.dtype, h.device = t.size(), t.stride(), t.dtype, t.device
        h.d2h_event = h.gpu = h.gpu_stream = h.h2d_event = None
        h.refs, h.unpacks, h.pass_id, h.index = 1, 0, -1, None
        h.version = t._version
        h.orig = weakref.ref(t)
        return h

    def __del__(self) -> None:
        owner = self.owner
        if owner is not None and self.host is not None:
            try:
                owner._release(self)
            except Exception:
                pass


def _check_version(h: "_Swapped") -> None:
    """Stock autograd's check that a saved tensor was not changed in place since it
    was saved (autograd cannot see it through a handle)."""
    orig = h.orig()
    if orig is not None and orig._version != h.version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified "
            f"by an inplace operation: [{h.dtype} {list(h.size)}] is at version "
            f"{orig._version}; expected version {h.version} instead (the tensor was "
            "saved through LMS activation swapping)."
        )


class _DevState:
    __slots__ = (
        "index", "d2h", "h2d", "est", "since_query", "order", "inflight",
        "inflight_bytes", "margin", "fwd_end", "peak_before", "largest",
        "swapped_in_fwd", "limit", "plan", "planned", "reactive", "cursor", "k",
        "reserve_k", "saved", "prev_saved", "rec_off", "rec_unswapped",
        "prev_off", "prev_growth", "guard_seen", "peak_marked", "slack",
        "released_seen", "fwd_evicted", "cap", "fwd_base", "fwd_marked",
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
        self._dev: Dict[Any, _DevState] = {}
        self._dedupe: Dict[int, tuple] = {}
        self._phase = "idle"
        self._pass_id = 0
        self._prefetch_pending = False
        self._kept_unpacks = 0
        self._trace: List[tuple] = []
        self._t0 = time.perf_counter()
        self._tls = threading.local()  # per-thread stack of entered hooks
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
        total = _host_total()
        limit = cfg.host_limit
        if limit is None:
            limit = host_mem_limit_from_env()
        if limit is None:
            # the processes on a node share its memory: 8 ranks each taking 80% of it
            # would be the kernel's OOM killer's business, not an error of ours
            limit = int(total * 0.80) // local_world_size() if total else 64 * GiB
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
                    lms = _allocator_lms()
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
                    )
                    self._share_host_budget()
        return self._pool

    def _share_host_budget(self, _in_use: Optional[int] = None) -> None:
        """Tells the eviction net (once loaded) the host limit and the pinned pool's bytes
        in use under it (its cached buffers yield to the net: see HostPool)."""
        guard, pool = _guard_state.get("module"), self._pool
        if guard is not None and pool is not None and self.config.guard:
            guard.set_host_budget(pool.limit, pool.in_use, pool.min_available)

    def _guard(self) -> Any:
        """The eviction net, armed, or None (``guard=False``, CPU, or not buildable)."""
        cfg = self.config
        if not cfg.guard or cfg.device_type != "cuda" or cfg.policy == "never":
            return None
        g = load_guard()
        if g is not None and not g.armed():
            g.arm(True)
        return g

    # -- context manager / hooks ---------------------------------------------------
    def __enter__(self) -> "ActivationSwapper":
        h = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        h.__enter__()
        stack = getattr(self._tls, "hooks", None)
        if stack is None:
            stack = self._tls.hooks = []
        stack.append(h)
        return self

    def __exit__(self, *exc: Any) -> None:
        h = self._tls.hooks.pop()
        h.__exit__(*exc)

    # -- statistics ----------------------------------------------------------------
    def _reset_counters(self) -> None:
        self.c = collections.Counter()
        self.throttle_s = 0.0

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            out: Dict[str, Any] = {
                "swap." + k: v for k, v in sorted(self.c.items())
            }
            out["swap.throttle_wait_ms"] = int(self.throttle_s * 1000)
            for key in ("out_bytes", "in_bytes", "out_count", "in_count", "kept_count",
                        "kept_bytes", "small_count", "dedupe_hits", "prefetched",
                        "prefetch_hits", "fetched_on_demand", "memory_queries",
                        "planned_count", "reactive_count", "throttle_waits",
                        "tail_kept", "predicted_kept", "host_full_kept",
                        "guard_fetched", "guard_forward_bytes", "guard_backward_bytes"):
                out.setdefault("swap." + key, 0)
            for dev, st in self._dev.items():
                tag = f"dev{dev}" if dev is not None else "cpu"
                out[f"policy.{tag}.margin_bytes"] = st.margin
                out[f"policy.{tag}.slack_bytes"] = st.slack
                out[f"policy.{tag}.device_limit_bytes"] = st.limit
                out[f"policy.{tag}.plan_bytes"] = st.plan
                out[f"policy.{tag}.prefetch_reserve_bytes"] = (
                    self._prefetch_reserve(st) if st.largest else None)
                out[f"policy.{tag}.forward_end_bytes"] = st.fwd_end
            if self._pool is not None:
                out.update(self._pool.stats())
            g = _guard_state.get("module") if self.config.guard else None
            out["guard.active"] = int(g is not None and g.armed())
            if g is not None:
                out.update({"guard." + k: int(v) for k, v in g.stats().items()
                            if k != "armed"})
            return out

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
    def _state(self, t: torch.Tensor) -> _DevState:
        key = t.device.index if t.device.type == "cuda" else None
        st = self._dev.get(key)
        if st is None:
            st = _DevState(key)
            if key is not None:
                st.d2h = torch.cuda.Stream(device=t.device)
                st.h2d = torch.cuda.Stream(device=t.device)
                guard = self._guard()
                if guard is not None:  # the net's counter is the process's
                    st.guard_seen = guard.evicted_bytes()
            self._dev[key] = st
        return st

    def _device_limit(self, st: _DevState) -> int:
        if st.limit is None:
            cfg = self.config
            if cfg.device_limit is not None:
                st.limit = int(cfg.device_limit)
            elif st.index is None:
                st.limit = 1 << 62
            else:
                lim = cap = 0
                lms = _allocator_lms()
                get = getattr(lms, "get_limit_lms", None) if lms else None
                if get is None:
                    get = getattr(torch.cuda, "get_limit_lms", None)
                if get is not None:
                    try:
                        lim = int(get())
                    except Exception:
                        lim = 0
                total = torch.cuda.get_device_properties(st.index).total_memory
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
                        cap = min(total, int(free) + torch.cuda.memory_reserved(st.index))
                        lim = cap - cap // 100
                    else:
                        lim = int(total * 0.98)
                st.limit = lim
                st.cap = max(cap, lim)
        return st.limit

    def _device_cap(self, st: _DevState) -> int:
        """What the caching allocator can have at most: free plus reserved memory when
        the net sets the limit, else the limit itself."""
        lim = self._device_limit(st)
        return st.cap if st.cap is not None else lim

    def _margin(self, st: _DevState) -> int:
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
                            int(float(frac) * self._device_limit(st)))
        return st.margin

    def _prefetch_reserve(self, st: _DevState) -> int:
        """Device memory prefetching leaves free for backward's own allocations: the
        margin, and at least ``prefetch_reserve_factor`` times the largest saved tensor
        (raised by a quarter after a step whose backward went over the limit).  Not
        learned down: backward's biggest allocations (ResNet-50's first layers allocate
        twice their largest activation in fp32) come at moments the prefetch level does
        not predict."""
        return max(self._margin(st), int(self._reserve_factor(st) * st.largest) + 256 * MiB)

    def _reserve_factor(self, st: _DevState) -> float:
        return max(float(self.config.prefetch_reserve_factor), st.reserve_k)

    def _allocated(self, st: _DevState) -> int:
        self.c["memory_queries"] += 1
        if st.index is None:
            return 0
        return torch.cuda.memory_allocated(st.index)

    def _inflight_allowance(self, st: _DevState) -> int:
        return max(int(self.config.max_inflight_bytes), st.largest)

    def _record_trace(self, st: _DevState, what: str) -> None:
        alloc = self._allocated(st) if st.index is not None else 0
        host = self._pool.in_use if self._pool is not None else 0
        self._trace.append((time.perf_counter() - self._t0, what, alloc, host))

    # -- phases ----------------------------------------------------------------------
    def _begin_forward(self) -> None:
        """First pack after a backward: learn the margin, start a new order."""
        self._phase = "fwd"
        self._dedupe.clear()
        self._prefetch_pending = False
        if self._pool is not None:
            self._pool.end_step()
        for st in self._dev.values():
            # what the net moved in backward is memory backward needed beyond its peak.
            # (Not only the failed requests' sizes, which are smaller: at a batch stock
            # PyTorch trains, 99% of an H100, ViT-L's backward failed for want of one
            # piece in a fragmented cache, and a margin raised by the requests alone let
            # it fail in 9 of the next 10 steps, each costing a second.)
            bwd_evicted = self._net_evicted(st, "guard_backward_bytes")
            guard = self._guard()
            if guard is not None and st.index is not None:
                released = guard.released(st.index)
                moved = st.planned + st.reactive + st.fwd_evicted + bwd_evicted
                st.slack = next_slack(st.slack, released > st.released_seen, moved,
                                      self._device_limit(st))
                st.released_seen = released
            if (st.index is not None and st.fwd_end is not None and st.largest
                    and self.config.adaptive_margin and self.config.margin is None):
                peak, exact = self._backward_peak(st)
                before = 0 if (exact or bwd_evicted > 0) else (st.peak_before or 0)
                old_k = st.k
                st.k = next_margin_factor(st.k, st.largest, st.fwd_end,
                                          before, peak + bwd_evicted,
                                          int(self.config.min_margin),
                                          self._min_margin_factor())
                st.k = damped(st.k, old_k)
                # over the limit is harm only where the net had to move memory (the
                # allocator's own retries are the slack's business); without the net,
                # from a step that set a new peak
                if (bwd_evicted > 0) if exact else (peak > (st.peak_before or 0)):
                    st.reserve_k = next_reserve_factor(self._reserve_factor(st), peak,
                                                       self._device_limit(st))
                self.c["margin_updates"] += 1
            if guard is not None and st.index is not None and self.config.policy == "auto":
                # forward's own peak, read at backward's start (_forward_peak_over)
                st.fwd_base = self._allocated(st)
                guard.mark_peak(st.index)
                st.fwd_marked = True
            st.fwd_end = None
            st.since_query = 1 << 30
            st.est = 0
            alive = [r for r in st.order if r() is not None]
            for i, r in enumerate(alive):
                h = r()
                if h is not None:
                    h.index = i
            st.order = alive
            st.swapped_in_fwd = 0
            st.planned = 0
            st.reactive = 0
            st.fwd_evicted = 0
            st.saved = 0
            st.rec_off, st.rec_unswapped = [], []

    def _backward_peak(self, st: _DevState) -> Tuple[int, bool]:
        """The device allocation at its highest since backward began, and whether that
        is this backward's own peak.  With the net, exact: the level at backward's start
        plus the net's running peak since then.  Without it, the program's
        ``max_memory_allocated``, which lms_swap must not reset: an older step's peak
        when this one set none, so only an upper bound (a first step at twice the
        memory held a UNet's margin at 28.5 GB for good)."""
        guard = self._guard()
        if guard is not None and st.peak_marked:
            st.peak_marked = False
            return int(st.fwd_end) + int(guard.peak_growth(st.index)), True
        return torch.cuda.max_memory_allocated(st.index), False

    def _forward_peak_over(self, st: _DevState) -> Optional[int]:
        """How far this forward's peak went over what the allocator can have (negative:
        under it), by the net's running peak since forward's start; None without the
        net, or when forward's start was not marked."""
        guard = self._guard()
        if guard is None or not st.fwd_marked:
            return None
        st.fwd_marked = False
        peak = st.fwd_base + int(guard.peak_growth(st.index))
        return peak - self._device_cap(st)

    def _net_evicted(self, st: _DevState, counter: str) -> int:
        """Bytes the eviction net moved since the last phase began (counted under
        ``counter``)."""
        guard = self._guard()
        now = guard.evicted_bytes() if guard is not None else 0
        moved, st.guard_seen = now - st.guard_seen, now
        if moved > 0:
            self.c[counter] += moved
        return moved

    def _net_moved(self, st: _DevState) -> int:
        """Bytes the eviction net has moved so far in this phase (0 without the net)."""
        guard = self._guard()
        return guard.evicted_bytes() - st.guard_seen if guard is not None else 0

    def _net_idle(self, st: _DevState) -> bool:
        """Whether the eviction net is there and has moved nothing in this phase."""
        return self._guard() is not None and self._net_moved(st) == 0

    def _min_margin_factor(self) -> float:
        f = self.config.min_margin_factor
        if f is None:
            f = 0.0 if self._guard() is not None else 1.0
        return float(f)

    def _begin_backward(self) -> None:
        self._phase = "bwd"
        self._pass_id += 1
        self._dedupe.clear()
        self._kept_unpacks = 0
        self._prefetch_pending = any(st.swapped_in_fwd for st in self._dev.values())
        for st in self._dev.values():
            # the net's evictions in forward were swaps the forecast should have planned
            fwd_evicted = st.fwd_evicted = self._net_evicted(st, "guard_forward_bytes")
            st.cursor = len(st.order)
            st.prev_saved = st.saved
            if st.index is not None and self.config.policy == "auto":
                st.fwd_end = self._allocated(st)
                peak_over = self._forward_peak_over(st)
                guard = self._guard()
                if guard is not None:
                    guard.mark_peak(st.index)
                    st.peak_marked = True
                else:
                    # without the net: the program's peak so far, which the next
                    # forward compares backward's against (_backward_peak)
                    st.peak_before = torch.cuda.max_memory_allocated(st.index)
                st.prev_off = st.rec_off
                # the net's evictions count as swapped: left out, an end they lowered
                # predicts the next forward under the trigger, it keeps what it should
                # swap, and the net evicts again at the same place every step (on an
                # H100 a Llama at 1.5x: 8 GB a step, synchronously, 7-8.6 s a step)
                st.prev_growth = growth_to_end(st.rec_off, st.rec_unswapped, st.fwd_end,
                                               st.planned + st.reactive + fwd_evicted)
                st.rec_off, st.rec_unswapped = [], []
                if self.config.plan:
                    trig = swap_trigger(self._device_limit(st), self._margin(st))
                    swapped = st.planned + st.reactive + fwd_evicted
                    if swapped == 0 and st.fwd_end <= trig:
                        plan = 0
                    else:
                        plan = next_plan(swapped, st.fwd_end, trig,
                                         max(256 * MiB, self._device_limit(st) // 128),
                                         peak_over)
                    st.plan = int(damped(plan, st.plan or None))
            self._drain(st, wait=False)

    # -- pack ------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        cfg = self.config
        if (cfg.policy == "never" or t.device.type != cfg.device_type
                or t.layout != torch.strided):
            return t
        tt = type(t)
        if tt is not torch.Tensor:
            return t  # parameters, subclasses (DTensor, fake tensors, ...)
        if t.is_leaf and t.requires_grad:
            return t
        nbytes = t.numel() * t.element_size()
        with self._lock:
            if self._phase != "fwd":
                self._begin_forward()
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
                if eligible and st.index is not None:
                    h = self._keep_evictable(t, nbytes)
            if cfg.dedupe:
                # weak references only: an abandoned graph must free its buffers
                self._dedupe[id(t)] = (weakref.ref(t), t._version,
                                       None if h is None else weakref.ref(h))
            if cfg.trace:
                self._record_trace(st, "out" if h is not None else "keep")
            return t if h is None else h

    def _decide(self, st: _DevState, t: torch.Tensor, nbytes: int) -> tuple:
        """(why it is swapped: None (kept), "always", "plan" or "pressure"; wait for
        earlier copies if too many are in flight?; could it be swapped at all?)"""
        cfg = self.config
        saved_before = st.saved
        st.saved += nbytes
        if not _dense_span(t):
            self.c["not_dense_kept"] += 1
            return None, False, False
        storage_bytes = _storage_bytes(t)
        if storage_bytes and nbytes < cfg.min_storage_fraction * storage_bytes:
            # a small view of a big storage: swapping it would not free the storage
            self.c["partial_view_kept"] += 1
            return None, False, False
        if cfg.policy == "always":
            return "always", True, True
        tail = in_tail(saved_before, nbytes, st.prev_saved, st.largest)
        pressure = self._pressure(st, nbytes, tail)
        if st.planned < st.plan:
            return "plan", pressure, True
        if pressure:
            return "pressure", True, True
        return None, False, True

    def _pressure(self, st: _DevState, nbytes: int, tail: bool = False) -> bool:
        """Whether the device allocation (which includes the tensor being saved) is over
        the trigger by :func:`should_swap`; for a tensor of the tail (:func:`in_tail`),
        only whether it is over the limit itself; while the tensor and one more like it
        fit under the limit, also whether the previous step predicts forward's end over
        the trigger (:func:`predict_forward_end`).  Queries the allocator only every
        ``query_every`` tensors while the estimate stays far below the trigger.  (A
        version that only waited for running copies instead of swapping, when those
        copies alone explained the pressure, ran out of device memory at 1.5x on the
        H100: the allocator no longer counts tensors whose copy is still running.)"""
        limit, margin = self._device_limit(st), self._margin(st)
        trigger = swap_trigger(limit, margin)
        st.since_query += 1
        slack = max(2 * st.largest, 1 * GiB)
        if st.est + nbytes <= trigger - slack and st.since_query < self.config.query_every:
            st.est += nbytes
            return False
        alloc = self._allocated(st)
        st.est = alloc
        st.since_query = 0
        st.rec_off.append(st.saved)
        # what the net moved is gone from the allocation as much as what was swapped
        st.rec_unswapped.append(alloc + st.planned + st.reactive + self._net_moved(st))
        if not should_swap(nbytes, alloc, limit, margin):
            return False
        if tail and alloc <= limit:
            self.c["tail_kept"] += 1
            return False
        if alloc + nbytes <= limit:
            # the previous step knows how this forward goes on: swap only when its end,
            # not this moment's transients and one tensor looked ahead, would be over
            # the trigger (GPT-2 on the H100 swapped a loss chunk per step for the
            # logits that were alive while it was saved)
            end = predict_forward_end(alloc, st.saved, st.prev_off, st.prev_growth,
                                      st.prev_saved)
            if end is not None and end <= trigger:
                self.c["predicted_kept"] += 1
                return False
        return True

    def _keep_evictable(self, t: torch.Tensor, nbytes: int) -> Optional[_Swapped]:
        """A handle for a tensor that stays on the device, registered with the eviction
        net (which may move it to host memory if the device runs out); None without the
        net (autograd then holds the tensor itself, as stock)."""
        guard = self._guard()
        if guard is None:
            return None
        return _Swapped.of(self, t, nbytes, slot=guard.Slot(t))

    def _may_keep(self, st: _DevState, why: str, nbytes: int) -> bool:
        """Whether a tensor that found no swap space may stay on the device: not under
        ``policy="always"``, and only while the device allocation, with as much again
        for the next output, stays under the limit."""
        if why == "always":
            return False
        return self._allocated(st) + nbytes <= self._device_limit(st)

    def _swap_out(self, st: _DevState, t: torch.Tensor, nbytes: int,
                  wait: bool = True) -> Optional[_Swapped]:
        host = self.pool.alloc(nbytes)  # may raise LMSHostMemoryError
        h = _Swapped.of(self, t, nbytes, host=host)
        src = t.as_strided((t.numel(),), (1,), t.storage_offset()).view(torch.uint8)
        if st.index is None:
            host.copy_(src)
            h.d2h_event = None
        else:
            cur = torch.cuda.current_stream(t.device)
            st.d2h.wait_stream(cur)
            with torch.cuda.stream(st.d2h):
                host.copy_(src, non_blocking=True)
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
                self._drain(st, wait=True, allowance=nbytes)
            else:
                self._drain(st, wait=wait)
        h.index = len(st.order)
        st.order.append(weakref.ref(h))
        st.swapped_in_fwd += 1
        self.c["out_count"] += 1
        self.c["out_bytes"] += nbytes
        return h

    def _drain(self, st: _DevState, wait: bool, allowance: Optional[int] = None) -> None:
        """Forget finished device->host copies; with ``wait``, block until not more
        than the in-flight allowance is waiting."""
        if allowance is None:
            allowance = self._inflight_allowance(st)
        while st.inflight:
            ev, n = st.inflight[0]
            if not ev.query():
                if not wait or st.inflight_bytes <= allowance:
                    break
                t0 = time.perf_counter()
                ev.synchronize()
                self.throttle_s += time.perf_counter() - t0
                self.c["throttle_waits"] += 1
            st.inflight.popleft()
            st.inflight_bytes -= n

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
                    st = self._dev.get(device.index if device.type == "cuda" else None)
                    if st is not None and st.order:
                        self._prefetch(st, st.cursor, device)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Swapped):
            self._unpack_kept(packed.device)
            return packed
        h = packed
        if h.slot is not None:
            t = h.slot.device_tensor()
            if t is not None:  # still on the device (the net did not need it)
                self._unpack_kept(h.device)
                _check_version(h)
                return t
        with self._lock:
            if self._phase == "fwd":
                self._begin_backward()
            st = self._dev[h.device.index if h.device.type == "cuda" else None]
            if h.gpu is None:
                t = self._fetch(st, h)
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
            if st.index is not None:
                cur = torch.cuda.current_stream(h.device)
                cur.wait_event(h.h2d_event)
                if h.gpu_stream != cur:
                    t.record_stream(cur)
            if h.index is not None:  # (an evicted slot is not in the swap order)
                if h.index < st.cursor:
                    st.cursor = h.index
                if self.config.prefetch_depth > 0:
                    self._prefetch(st, h.index, h.device)
            if self.config.trace:
                self._record_trace(st, "in")
        _check_version(h)
        return t

    def _fetch(self, st: _DevState, h: _Swapped) -> torch.Tensor:
        if st.index is None:
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
            dst.as_strided((dst.numel(),), (1,), 0).view(torch.uint8).copy_(h.host)
            h.gpu = dst
            self.c["in_count"] += 1
            self.c["in_bytes"] += h.nbytes
            return dst
        cur = torch.cuda.current_stream(h.device)
        try:
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
        except _OutOfMemoryError:
            # copies still running hold memory that the allocator frees once they end
            torch.cuda.synchronize(h.device)
            dst = torch.empty_strided(h.size, h.stride, dtype=h.dtype, device=h.device)
        # dst may reuse memory that work queued on `cur` still reads
        st.h2d.wait_stream(cur)
        if h.d2h_event is not None:
            st.h2d.wait_event(h.d2h_event)
        # a slot the net evicted: its bytes are in pageable memory, and the net's copy
        # had finished before it freed the device memory
        src = h.host if h.slot is None else h.slot.host_bytes()
        with torch.cuda.stream(st.h2d):
            dst.as_strided((dst.numel(),), (1,), 0).view(torch.uint8).copy_(
                src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(st.h2d)
        dst.record_stream(st.h2d)
        h.gpu = dst
        h.gpu_stream = cur
        h.h2d_event = ev
        self.c["in_count"] += 1
        self.c["in_bytes"] += h.nbytes
        return dst

    def _prefetch(self, st: _DevState, start: int, device: torch.device) -> None:
        """Fetch the swapped tensors below position ``start`` of the pack order
        (backward needs them in about that order), at most ``prefetch_depth`` ahead and
        only while the device allocation stays under forward's end and under the limit
        less :meth:`_prefetch_reserve` (the room backward needs for itself)."""
        depth = int(self.config.prefetch_depth)
        order = st.order
        j = min(start, len(order)) - 1
        count = 0
        free = None
        fetched = 0
        limit = self._device_limit(st)
        while j >= 0 and count < depth:
            c = order[j]()
            j -= 1
            if c is None or c.pass_id == self._pass_id or c.owner is None:
                continue
            if c.device != device:
                continue
            count += 1
            if c.gpu is not None:
                continue
            if free is None:
                ceiling = limit - self._prefetch_reserve(st)
                if st.fwd_end is not None and self.config.policy == "auto":
                    # never hold more than forward left: backward's peak over forward's
                    # end then measures backward's own need (the margin), not how far
                    # prefetching went (a margin that fed on its own prefetching stayed
                    # at 17 GB for a GPT-2 that needed less, on the H100)
                    ceiling = min(ceiling, st.fwd_end)
                free = ceiling - self._allocated(st)
            if fetched + c.nbytes > free:
                self.c["prefetch_deferred"] += 1
                break
            self._fetch(st, c)
            fetched += c.nbytes
            self.c["prefetched"] += 1

    # -- release -----------------------------------------------------------------------
    def _release(self, h: _Swapped) -> None:
        host, h.host = h.host, None
        ev = h.h2d_event if h.h2d_event is not None else h.d2h_event
        h.gpu = None
        if self._pool is not None and host is not None:
            self._pool.free(host, ev)  # safe from any thread, never blocks


# --------------------------------------------------------------------------------------
# module-level API (what torch.cuda.set_enabled_lms calls)
# --------------------------------------------------------------------------------------
_default: Optional[ActivationSwapper] = None
_default_lock = threading.Lock()
_tls = threading.local()


def get_swapper() -> ActivationSwapper:
    """The process-wide swapper used by :func:`enable` and :func:`swapping`."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = ActivationSwapper()
    return _default


def configure(**kw: Any) -> ActivationSwapper:
    """Change tunables of the process-wide swapper (see the module docstring)."""
    return get_swapper().configure(**kw)


def enable(**kw: Any) -> None:
    """Swap saved activations under memory pressure in the calling thread until
    :func:`disable`.  Keyword arguments are tunables (see the module docstring).
    Calling it again while enabled only applies the tunables."""
    sw = get_swapper()
    if kw:
        sw.configure(**kw)
    if getattr(_tls, "enabled", False):
        return
    sw.__enter__()
    _tls.enabled = True


def disable() -> None:
    """Undo :func:`enable` in the calling thread (saved tensors already swapped still
    come back in backward).  Hooks entered after :func:`enable` must be left first."""
    if not getattr(_tls, "enabled", False):
        return
    get_swapper().__exit__(None, None, None)
    _tls.enabled = False


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect in the calling thread."""
    return bool(getattr(_tls, "enabled", False))


@contextlib.contextmanager
def swapping(**kw: Any):
    """Context manager form: ``with swapping(): loss = model(x)``.  Uses the
    process-wide swapper (one pinned pool, learned margins and statistics kept from
    step to step); keyword arguments are applied to it with :func:`configure` and stay
    in effect."""
    sw = get_swapper()
    if kw:
        sw.configure(**kw)
    with sw:
        yield sw


def stats() -> Dict[str, Any]:
    """Counters of the process-wide swapper (``swap.*``, ``host.*``, ``policy.*``)."""
    return get_swapper().stats()


def reset_stats() -> None:
    get_swapper().reset_stats()


def trace() -> List[tuple]:
    """``(seconds, event, device bytes allocated, host bytes in use)`` per pack/unpack
    recorded while ``trace=True``."""
    return get_swapper().trace()


def empty_cache() -> int:
    """Release cached pinned host buffers (those not holding a swapped tensor)."""
    return get_swapper().empty_cache()
