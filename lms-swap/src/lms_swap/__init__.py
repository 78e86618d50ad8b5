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
  throttled so that the memory of tensors waiting for their copy, with the allocation,
  leaves room under the limit for the next allocation (it waits for the oldest copies
  first, so compute and copies run side by side);
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
* keeps swapped tensors in pinned host chunks carved into ranges of exactly their size
  (no power-of-two rounding; any mix of sizes reuses what was pinned) under a host
  memory limit, and raises :class:`LMSHostMemoryError` (a ``torch.OutOfMemoryError``)
  before the machine runs out of memory; when swap space is full, a tensor stays on
  the device as long as the device allocation is under its limit, and the error is
  raised only when neither has room.

Use, on a PyTorch built with the LMS patch::

    torch.cuda.set_enabled_lms(True)      # allocator LMS + this layer (calls enable())

on any PyTorch >= 2.4 (the lms-swap distribution: ``pip install ./lms-swap``)::

    import lms_swap
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
    limit less the margin and less this many (default 1.5) times the largest saved
    tensor (raised by a quarter after a step whose backward the eviction net had to
    rescue, or without the net whose backward went over the limit; never lowered:
    backward's biggest allocations, e.g. ResNet-50's first layers allocating twice
    their largest activation in fp32, come at moments no measurement at other moments
    predicts).  (With 3, a UNet at 1.5x on the H100, whose largest tensor is 10.5 GB,
    could prefetch nothing until backward had freed 14 GB: its copies in started
    0.22 s into backward, and the compute stream waited for them at the end.)
``prefetch_past_peak``
    (default True, needs the eviction net) once a backward of the same shape has run,
    prefetching may also fill device memory past forward's end: up to that backward's
    peak, less what its own allocations grew by over the rest of it from the same
    position (measured between the unpacks of swapped tensors, prefetched bytes left
    out), and up to the limit less a pad (a 64th of it, doubled after a backward the net
    had to help).  Where backward's peak comes first (a language model's loss), the
    rest of backward is then prefetched instead of fetched on demand.  (A checkpointed
    Llama at twice stock's batch on the H100: 21 of 21 swapped tensors fetched on
    demand each step, 70.6% of the PCIe bound, before; 5 of 21 and 75.0% with it.)
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
    under ``policy="always"``, device bytes that may wait for a device->host copy
    before forward waits (default 1 GiB or the largest tensor seen, whichever is
    more); under memory pressure forward waits for every earlier copy before it goes
    on.  With any policy, forward also waits for the oldest copies while those still
    waiting, with the allocation, would leave less than the largest saved tensor free
    under the limit.
``host_limit``
    bytes of pinned host memory for swap space, per process.  Default: env
    ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` (shared with the allocator's host spill), else
    80% of the machine's RAM, shared equally by the processes on the node
    (:func:`local_world_size`: torchrun's ``LOCAL_WORLD_SIZE``).  On a patched build
    this rule is the allocator's own (asked through ``torch.cuda.lms``), and its
    ``_host_reserve``/``_host_release`` account the same budget; on stock torch
    lms_swap applies its copy of the rule. :func:`host_budget_source` says which is in
    force.
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
``chunked_loss``
    ``"auto"`` (default): where stock's ``F.cross_entropy`` over fp32 logits could not fit
    (the allocation plus one and a half tensors of the input's size over what the caching
    allocator can have), compute it in blocks of rows (:mod:`.chunked_loss`: the same
    formula rounded in another order, not bitwise equal); ``True``: for every supported
    loss of 256 MiB or more; ``False``: never.  Counted in ``swap.chunked_losses``.
``settle_when_releases_persist``
    (default False, until measured on every loop) a step after which the plan was raised
    takes the raise back where the step swapped less than the step before it, of the same
    shape, and the caching allocator released its cache no more often than there, neither
    step needing the eviction net: swapping more did not spare those releases.  (Without
    it, any release keeps the raise.)  Counted in ``swap.plan_settled_past_releases``.
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

import contextlib
import threading
import warnings
from typing import Any, Dict, List, Optional

import torch

from . import guard  # noqa: F401  (the module: its loaded net is process state)
from .environment import (ENV_HOST_LIMIT, ENV_THRESHOLD, GiB, KiB, LMSHostMemoryError,  # noqa: F401
                          MiB, host_budget_default, host_budget_rule, host_budget_source,
                          host_mem_limit_from_env, host_total, local_world_size)
from .guard import GUARD_SOURCE, build_guard, load_guard  # noqa: F401
from .host_pool import HostPool  # noqa: F401
from .policy import (SwapConfig, damped, dense_span, growth_to_end, in_tail,  # noqa: F401
                     inflight_room, learn_margin, next_margin_factor, next_plan, next_reserve_factor,
                     next_slack, predict_forward_end, should_swap, swap_trigger)
from .state import DevState  # noqa: F401
from .swapper import ActivationSwapper

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
    "host_budget_default",
    "host_budget_source",
    "local_world_size",
]

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
    else:
        sw.config.validate()  # the environment's settings fail here, not at the first swap
    if getattr(_tls, "enabled", False):
        return
    _say_when_nothing_to_swap(sw)
    sw.__enter__()
    _tls.enabled = True


_told_no_cuda = False


def _say_when_nothing_to_swap(sw: ActivationSwapper) -> None:
    """Once per process: :func:`enable` for CUDA where PyTorch sees no CUDA device works (the
    hooks are in place, training runs as without them) but swaps nothing, which is said."""
    global _told_no_cuda
    if _told_no_cuda or sw.config.device_type != "cuda" or torch.cuda.is_available():
        return
    _told_no_cuda = True
    why = ("has no CUDA support" if torch.version.cuda is None
           else "sees no CUDA device")
    warnings.warn(f"LMS activation swapping is enabled, but this PyTorch ({torch.__version__}) "
                  f"{why}: tensors on the CPU are already in host memory, so nothing is swapped "
                  f"(enable(device_type='cpu') swaps CPU tensors, as the tests do)",
                  RuntimeWarning, stacklevel=3)


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
    else:
        sw.config.validate()
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
