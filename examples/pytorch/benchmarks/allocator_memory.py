"""Device memory counters of whichever allocator is PyTorch's in a benchmark's child: the
native caching allocator's, or, under the pluggable LMS allocator (``lms_swap.allocator``),
its own, since PyTorch keeps the caching allocator's statistics for the native one only."""

from __future__ import annotations


def readings(alloc=None) -> dict:
    """Bytes ``allocated``, ``reserved``, ``peak_allocated`` and ``peak_reserved`` on the current
    device, and ``alloc_retries`` and ``sync_all_streams`` so far (the caching allocator's
    retries release its cache after synchronizing the device: each one stalls).  ``alloc``:
    the installed ``lms_swap.allocator``, or None for the native allocator.  Under it there are
    no retries (its LMS's search is in its own counters: 0 and None), and ``peak_reserved`` is
    what it reserves now (it keeps no peak of that)."""
    if alloc is not None:
        ms = alloc.memory_stats()
        return {"allocated": ms["allocated_bytes"], "reserved": ms["reserved_bytes"],
                "peak_allocated": ms["peak_allocated_bytes"], "peak_reserved": ms["reserved_bytes"],
                "alloc_retries": 0, "sync_all_streams": None}
    import torch
    ms = torch.cuda.memory_stats()
    return {"allocated": ms.get("allocated_bytes.all.current", 0),
            "reserved": ms.get("reserved_bytes.all.current", 0),
            "peak_allocated": ms.get("allocated_bytes.all.peak", 0),
            "peak_reserved": ms.get("reserved_bytes.all.peak", 0),
            "alloc_retries": ms.get("num_alloc_retries", 0),
            "sync_all_streams": ms.get("num_sync_all_streams")}
