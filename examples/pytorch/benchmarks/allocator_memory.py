"""Device memory counters of whichever allocator is PyTorch's in a benchmark's child: the
native caching allocator's, or, under the pluggable LMS allocator (``lms_swap.allocator``),
its own, since PyTorch keeps the caching allocator's statistics for the native one only."""

from __future__ import annotations


# The pluggable allocator's LMS counters that only grow (``lms_swap.allocator.lms_stats``):
# its page moves, their own time and the device syncs in it, what its cache released,
# host pages made while a request waited, the core's spills past the LMS limit after the fact
# (none expected), and the launch gate's holds.  Where a step's time went under this
# allocator is in them.
ALLOC_TOTALS = (
    "swap_out_bytes", "swap_out_count", "swap_in_bytes", "swap_in_count", "num_ooms",
    "reclaim_events", "alloc_served.lms_reclaim", "alloc_served.defrag",
    "swap_out_time_ns", "swap_in_time_ns", "swap_out_quiesce_ns", "swap_out_copy_wait_ns",
    "host_pages_dropped_on_free", "defrag_released_bytes", "returns_held", "limit_spills",
    "host_pool.made_on_demand_bytes",
    "launch_gate.closes", "launch_gate.close_wait_ns", "launch_gate.calls_held")


def alloc_totals(alloc, lms_stats=None) -> dict:
    """:data:`ALLOC_TOTALS` as they stand, as ``alloc.<name>`` (0 where the build has no
    such counter); ``alloc`` is the installed ``lms_swap.allocator``, ``lms_stats`` its
    ``lms_stats()`` where the caller read them already (one reading serves both)."""
    st = alloc.lms_stats() if lms_stats is None else lms_stats
    return {f"alloc.{k}": int(st.get(k) or 0) for k in ALLOC_TOTALS}


def readings(alloc=None) -> dict:
    """Bytes ``allocated``, ``reserved``, ``peak_allocated`` and ``peak_reserved`` on the current
    device, and ``alloc_retries`` and ``sync_all_streams`` so far (the caching allocator's
    retries release its cache after synchronizing the device: each one stalls).  ``alloc``:
    the installed ``lms_swap.allocator``, or None for the native allocator.  Under it there are
    no retries (its LMS's search is in its own counters: 0 and None), and its bytes are those
    on the device: allocated less the pages LMS moved to host memory, and reserved pages on
    the device.  ``host_pages_peak``: the pinned host pages the pluggable allocator's LMS made
    (0 for the native allocator), at least the most it held at once: the larger of its pages
    in use at their peak and its pool now.  The CUDA driver makes them outside the process's
    RSS, so a host figure adds them.  (Not the host budget's peak: activation swapping books
    its pinned chunks there too, and those are in the RSS.)"""
    if alloc is not None:
        ms, lms = alloc.memory_stats(), alloc.lms_stats()
        return {"allocated": ms["device_allocated_bytes"], "reserved": ms["device_reserved_bytes"],
                "peak_allocated": ms["peak_device_allocated_bytes"],
                "peak_reserved": ms["peak_device_reserved_bytes"],
                "alloc_retries": 0, "sync_all_streams": None,
                "host_pages_peak": max(int(lms.get("host_bytes.peak", 0)),
                                       int(lms.get("host_pool.total_bytes", 0)))}
    import torch
    ms = torch.cuda.memory_stats()
    return {"allocated": ms.get("allocated_bytes.all.current", 0),
            "reserved": ms.get("reserved_bytes.all.current", 0),
            "peak_allocated": ms.get("allocated_bytes.all.peak", 0),
            "peak_reserved": ms.get("reserved_bytes.all.peak", 0),
            "alloc_retries": ms.get("num_alloc_retries", 0),
            "sync_all_streams": ms.get("num_sync_all_streams"), "host_pages_peak": 0}


def host_gib(r: dict) -> str:
    """A result's peak host memory in GiB for a table: its RSS, plus `` + N`` where the
    pluggable allocator held pinned host pages outside the RSS."""
    rss, pages = r.get("peak_host_rss"), r.get("peak_host_pages") or 0
    if not rss:
        return "-"
    return f"{rss / 2**30:.1f}" + (f" + {pages / 2**30:.1f}" if pages else "")
