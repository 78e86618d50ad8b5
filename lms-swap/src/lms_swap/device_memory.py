"""How much device memory PyTorch's CUDA allocator holds, under any allocator.

The native caching allocator keeps counters (``torch.cuda.memory_allocated`` and its
kin).  A pluggable allocator (``torch.cuda.memory.change_current_allocator``) keeps none:
asking raises ("CUDAPluggableAllocator does not yet support getDeviceStats"), which would
end a training step.  A pluggable allocator that keeps counters of its own gives them
through :func:`use_counters` (``lms_swap.allocator`` does when it is installed).  Elsewhere
the driver's view stands in: the device memory in use by anything (``cudaMemGetInfo``),
which counts the CUDA context, other processes and a pluggable allocator's cache too, so
the swapper sees more pressure than there is and swaps early, never late; its peak is the
highest value read here.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch

__all__ = ["allocated", "reserved", "peak_allocated", "counted_by_allocator", "use_counters",
           "use_peak_meter", "peak_meter"]

_counted: Dict[int, bool] = {}      # device -> its allocator keeps counters
_driver_peak: Dict[int, int] = {}   # device -> highest in-use value read from the driver
# device -> (allocated, reserved, peak allocated) of a pluggable allocator that counts
_counters: Optional[Callable[[int], Tuple[int, int, int]]] = None
# a pluggable allocator's running peak: mark_peak(i), peak_growth(i), released(i)
_meter: Optional[Any] = None


def use_counters(counters: Optional[Callable[[int], Tuple[int, int, int]]]) -> None:
    """Makes ``counters(index) -> (allocated, reserved, peak_allocated)`` of device
    ``index`` the answer for a pluggable allocator that keeps its own counts (None: the
    driver's view again)."""
    global _counters
    _counters = counters


def use_peak_meter(meter: Optional[Any]) -> None:
    """Makes ``meter`` the running peak of a pluggable allocator that keeps one (None:
    none): ``mark_peak(index)`` sets it to the allocated bytes now, ``peak_growth(index)``
    is the highest allocated since less that level, ``released(index)`` counts the times
    it gave memory back to the driver.  The eviction net keeps the same three under the
    native allocator; with neither, a backward's peak is only bounded from above by the
    program's peak."""
    global _meter
    _meter = meter


def peak_meter() -> Optional[Any]:
    """The pluggable allocator's running peak given to :func:`use_peak_meter`, or None."""
    return _meter


def _in_use(index: int) -> int:
    free, total = torch.cuda.mem_get_info(index)
    used = int(total) - int(free)
    if used > _driver_peak.get(index, 0):
        _driver_peak[index] = used
    return used


def counted_by_allocator(index: int) -> bool:
    """Whether the allocator of device ``index`` keeps its own counters."""
    if _counters is not None:
        return True
    if index not in _counted:
        try:
            torch.cuda.memory_allocated(index)
            _counted[index] = True
        except RuntimeError:
            _counted[index] = False
    return _counted[index]


def allocated(index: int) -> int:
    """Bytes of tensors on device ``index`` (the allocator's count, else the driver's
    in-use bytes)."""
    if _counters is not None:
        return int(_counters(index)[0])
    if counted_by_allocator(index):
        return torch.cuda.memory_allocated(index)
    return _in_use(index)


def reserved(index: int) -> int:
    """Bytes the allocator holds on device ``index``, cached ones included."""
    if _counters is not None:
        return int(_counters(index)[1])
    if counted_by_allocator(index):
        return torch.cuda.memory_reserved(index)
    return _in_use(index)


def peak_allocated(index: int) -> int:
    """The highest :func:`allocated` since the program began (not reset here)."""
    if _counters is not None:
        return int(_counters(index)[2])
    if counted_by_allocator(index):
        return torch.cuda.max_memory_allocated(index)
    return max(_driver_peak.get(index, 0), _in_use(index))
