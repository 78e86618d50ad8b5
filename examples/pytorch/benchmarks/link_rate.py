"""Pinned copy rates of this process's GPU: device to host, host to device, and both at once.

The benchmarks' PCIe bound uses FACTS.md's rates (54 GB/s out, 53 in). Two starts of the
device machine have landed on hosts whose copies ran 8-10% apart (runs 95-100). Each run
therefore measures its own host's link too, and reports its fraction of that bound beside
FACTS.md's.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Optional

GiB = 1 << 30
FACTS_RATES = {"d2h_gbps": 54.0, "h2d_gbps": 53.0}  # FACTS.md: H100 <-> pinned host, GB/s


def pinned_rates(nbytes: int = 2 * GiB, repeat: int = 3,
                 barrier: Optional[Callable[[], None]] = None) -> Dict[str, float]:
    """GB/s of ``repeat`` copies of ``nbytes`` between the current GPU and pinned host memory:
    ``d2h_gbps``, ``h2d_gbps``, and ``both_ways_gbps_each`` (one copy each way at once, on
    two streams: forward's copies out and backward's copies in overlap at step boundaries).
    ``barrier`` (e.g. ``torch.distributed.barrier``) lines up every rank before each timing."""
    import torch

    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def timed(copies) -> float:
        # the best of three timings: a link's rate, not its first use (the first timing
        # on a freshly started machine has come out 27% under the next ones: run 104)
        best = 0.0
        for _ in range(3):
            torch.cuda.synchronize()
            if barrier is not None:
                barrier()
            t0 = time.perf_counter()
            for stream, dst, src in copies:
                with torch.cuda.stream(stream):
                    for _ in range(repeat):
                        dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = max(best, repeat * nbytes / (time.perf_counter() - t0) / 1e9)
        return round(best, 1)

    cur = torch.cuda.current_stream()
    host.copy_(dev, non_blocking=True)  # warm both directions
    dev.copy_(host, non_blocking=True)
    rates = {"d2h_gbps": timed([(cur, host, dev)]), "h2d_gbps": timed([(cur, dev, host)])}
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    rates["both_ways_gbps_each"] = timed([(s1, host, dev), (s2, dev2, host2)])
    del dev, host, dev2, host2
    torch.cuda.empty_cache()
    return rates


def pcie_step_s(out_bytes: float, in_bytes: float, rates: Dict[str, float]) -> float:
    """The copy term of the bound: out at ``d2h_gbps``, in at ``h2d_gbps`` (FACTS_RATES or
    a host's measured rates)."""
    return out_bytes / (rates["d2h_gbps"] * 1e9) + in_bytes / (rates["h2d_gbps"] * 1e9)
