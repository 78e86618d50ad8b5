#!/usr/bin/env python3
"""Read, log and plot LMS statistics.

Two sources of numbers:
  * lms_swap.stats()            activation swapping (this repository's layer):
                                swap.* (bytes/counts out and in, prefetch hits, waits),
                                host.* (pinned pool: in use, peak, limit), policy.*
  * torch.cuda.memory_stats()   on a PyTorch built with the LMS patch, the allocator's
                                own counters under "lms." keys (host spill, reclaims, ...)

This example trains a few steps of a ResNet with swapping on, logs the counters per
step (CSV), and plots device and host memory over one step from lms_swap's trace
(trace=True records, at every pack/unpack, the device bytes allocated and the host bytes
holding swapped tensors):

    python examples/pytorch/lmsstats.py --batch-size 600 --image-size 448 --out lmsstats/
    # writes lmsstats/stats.csv, lmsstats/memory_over_step.png

Use the same calls in your own loop:

    lms = load_lms_swap(); lms.enable()
    ...train a step...
    print(lms.stats()["swap.out_bytes"], torch.cuda.memory_stats().get("lms.host_bytes.current"))
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GiB = 1 << 30


def allocator_lms_stats(torch):
    """The allocator's lms.* counters (patched build), {} on stock PyTorch."""
    try:
        return {k: v for k, v in torch.cuda.memory_stats().items() if k.startswith("lms.")}
    except Exception:
        return {}


def main(argv=None):
    import torch
    import torch.nn.functional as F
    import torchvision
    from lms_swap_loader import load_lms_swap

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--policy", default="auto", choices=["auto", "always"])
    p.add_argument("--device-limit-gb", type=float, default=None,
                   help="swap above this allocation (to see swapping on a small batch)")
    p.add_argument("--out", default="lmsstats")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    lms = load_lms_swap()
    kw = {"policy": args.policy}
    if args.device_limit_gb:
        kw["device_limit"] = int(args.device_limit_gb * GiB)
    lms.configure(**kw)
    lms.enable()

    model = getattr(torchvision.models, args.arch)().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch_size,), device="cuda")

    rows = []
    last = lms.stats()
    for step in range(args.steps):
        traced = step == args.steps - 1
        lms.configure(trace=traced)
        if traced:
            lms.reset_stats()
            last = lms.stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        s = lms.stats()
        row = {
            "step": step, "seconds": round(dt, 4),
            "swapped_out_GiB": (s["swap.out_bytes"] - last["swap.out_bytes"]) / GiB,
            "swapped_in_GiB": (s["swap.in_bytes"] - last["swap.in_bytes"]) / GiB,
            "prefetch_hits": s["swap.prefetch_hits"] - last["swap.prefetch_hits"],
            "fetched_on_demand": s["swap.fetched_on_demand"] - last["swap.fetched_on_demand"],
            "host_peak_GiB": s.get("host.peak_in_use_bytes", 0) / GiB,
            "host_reserved_GiB": s.get("host.reserved_bytes", 0) / GiB,
            "gpu_peak_GiB": torch.cuda.max_memory_allocated() / GiB,
        }
        row.update(allocator_lms_stats(torch))
        rows.append(row)
        last = s
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
    lms.disable()

    with open(os.path.join(args.out, "stats.csv"), "w", newline="") as f:
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in rows[0], k))
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print("all counters after the last step:")
    for k, v in sorted(lms.stats().items()):
        print(f"  {k:40s} {v}")

    trace = lms.trace()
    if not trace:
        print("no swapping events traced")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = trace[0][0]
    ts = [(e[0] - t0) * 1000 for e in trace]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(ts, [e[2] / GiB for e in trace], label="device: allocated (GiB)")
    ax.plot(ts, [e[3] / GiB for e in trace], label="host: swapped tensors (GiB)")
    outs = [t for t, e in zip(ts, trace) if e[1] == "out"]
    ins = [t for t, e in zip(ts, trace) if e[1] == "in"]
    ax.scatter(outs, [0] * len(outs), marker="|", s=60, label="swap out (pack)")
    ax.scatter(ins, [0.5] * len(ins), marker="|", s=60, label="back in (unpack)")
    ax.set_xlabel("ms since the first saved tensor of the step (CPU time of pack/unpack)")
    ax.set_ylabel("GiB")
    ax.set_title(f"{args.arch} batch {args.batch_size} {args.image_size}px: memory over one step with LMS swapping")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path = os.path.join(args.out, "memory_over_step.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
