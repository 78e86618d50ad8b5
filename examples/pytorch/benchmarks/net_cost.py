"""What one intervention of the eviction net costs, and what the link does on this machine.

When the forecast is wrong, the net (``lms_swap_guard.cpp``) moves kept activations to host
memory inside the failing allocation, one synchronous copy at a time into freshly mapped
pageable memory (faulted in first), and backward fetches each back on demand.  This script times those three
parts apart for ``--count`` tensors of ``--mib`` MiB (the defaults: Llama at 2.0x, where one
net event in a settled step moved 11 GB), beside pinned copies of the same bytes (the rates
the PCIe bound of the benchmarks assumes: FACTS.md's 54 GB/s out, 53 in):

  evict            guard.evict(): map and fault in the host memory, copy, sync, per tensor
                   (until run 99 the net faulted pages in with MAP_POPULATE, one thread)
  fetch            what the swapper does for an evicted slot: a copy of its pageable
                   bytes into a new device tensor on a side stream, then a sync
  free             the slots dropped (munmap of their host copies)
  populate         mmap(MAP_POPULATE) of the same bytes alone (what the net used to pay)
  pinned out/in    cudaMemcpyAsync device<->pinned host of 2 GiB (link_rate.py), each way
                   alone and both at once (runs 99-100 copied the whole 11.7 GB)

    python3 examples/pytorch/benchmarks/net_cost.py --count 26 --mib 430 --out net_cost.json
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # link_rate


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=26, help="tensors (default 26)")
    ap.add_argument("--mib", type=int, default=430, help="MiB each (default 430)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds (default 2)")
    ap.add_argument("--out", default="", help="JSON file for the results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("net_cost: needs a CUDA GPU", file=sys.stderr)
        return 2

    from link_rate import GiB, pinned_rates
    from lms_swap_loader import load_lms_swap

    lms = load_lms_swap(prefer_patched=False)
    guard = sys.modules[lms.__name__ + ".guard"].load_guard(required=True)
    guard.arm(True)
    n = args.mib << 20
    total = n * args.count
    gb = total / 1e9
    rows = []
    for rnd in range(args.repeat):
        ts = [torch.full((n,), i % 251, dtype=torch.uint8, device="cuda")
              for i in range(args.count)]
        slots = [guard.Slot(t) for t in ts]
        del ts  # the slots own the storages now (owners 1: evictable)
        t_evict = _timed(lambda: guard.evict(0, total))
        evicted = sum(1 for s in slots if s.evicted)
        side = torch.cuda.Stream()
        back = []

        def fetch():
            for s in slots:
                src = s.host_bytes()
                dst = torch.empty(n, dtype=torch.uint8, device="cuda")
                with torch.cuda.stream(side):
                    dst.copy_(src, non_blocking=True)
                back.append(dst)

        t_fetch = _timed(fetch)
        ok = all(int(b[0].item()) == i % 251 and int(b[-1].item()) == i % 251
                 for i, b in enumerate(back))
        del back
        t0 = time.perf_counter()
        del slots
        t_free = time.perf_counter() - t0

        t0 = time.perf_counter()
        maps = []
        for _ in range(args.count):
            m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                          | getattr(mmap, "MAP_POPULATE", 0))
            maps.append(m)
        t_pop = time.perf_counter() - t0
        for m in maps:
            m.close()

        rates = pinned_rates(min(total, 2 * GiB))
        row = {
            "round": rnd, "tensors": args.count, "mib": args.mib, "gb": round(gb, 2),
            "evicted": evicted, "bytes_ok": ok,
            "evict_s": round(t_evict, 3), "evict_gb_s": round(gb / t_evict, 2),
            "fetch_s": round(t_fetch, 3), "fetch_gb_s": round(gb / t_fetch, 2),
            "free_s": round(t_free, 3),
            "populate_s": round(t_pop, 3), "populate_gb_s": round(gb / t_pop, 2),
            "pinned_out_gb_s": rates["d2h_gbps"], "pinned_in_gb_s": rates["h2d_gbps"],
            "pinned_both_gb_s_each": rates["both_ways_gbps_each"],
        }
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
