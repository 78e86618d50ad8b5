#!/usr/bin/env python3
"""Activation swapping under torchrun: DDP or FSDP2 (fully_shard), one process per GPU.

    torchrun --nproc-per-node 2 examples/pytorch/ddp_lms.py --model resnet50 --batch 2700 --engine ddp
    torchrun --nproc-per-node 2 examples/pytorch/ddp_lms.py --model llama --batch 27 --engine fsdp
    ... --no-lms            # the same job without swapping (stock PyTorch)

Each rank trains a model of benchmarks/zoo.py (unmodified library code) on its own GPU with
``lms_swap`` on its defaults. What this adds over a single-GPU job:

* **Host memory is per node.** The ranks on a node share its RAM: by default each rank's
  pinned swap space is 80% of it divided by torchrun's ``LOCAL_WORLD_SIZE``
  (``lms_swap.local_world_size()``; the allocator's own LMS on a patched build divides the
  same way). ``PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB`` sets it per process; the error when it is
  exhausted names the rank and that setting.
* **NUMA.** Each rank is bound to the CPUs of its GPU's NUMA node where the machine exposes
  it (``/sys/bus/pci/devices/<gpu>/numa_node``), before it allocates anything: pinned host
  memory is then first touched, and so placed, on the node next to the GPU's PCIe root,
  which is what the copies' bandwidth depends on. ``--no-numa`` leaves the binding alone
  (e.g. when the launcher already binds: ``numactl --cpunodebind=N --membind=N``).
* **Communication streams.** DDP all-reduces gradient buckets, FSDP all-gathers parameters
  and reduce-scatters gradients, on NCCL's streams while backward runs; swapped activations
  come back on lms_swap's own stream and are handed to autograd only after their copy has
  finished, so neither waits for the other's memory. (Bitwise equality with and without
  swapping under DDP is tested on CPU with gloo: tests/test_lms_swap_ddp.py.)

Prints one JSON line per rank at the end (``RESULT {...}``): throughput, step time, peak device
and host memory, bytes swapped per step. ``--search LO HI`` (one process) finds stock's
largest per-rank batch; ``--max-gpu-gib`` caps each rank's device memory.
benchmarks/bench_distributed.py runs the whole comparison.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time
from typing import List, Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))               # lms_swap_loader
sys.path.insert(0, str(HERE / "benchmarks"))  # zoo


def parse_cpulist(text: str) -> List[int]:
    """CPUs of a sysfs cpulist such as ``0-3,8,10-11``."""
    cpus: List[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_numa_node(pci_bus_id: str, sysfs: pathlib.Path = pathlib.Path("/sys")) -> Optional[int]:
    """The NUMA node of the PCI device ``pci_bus_id`` (``0000:1b:00.0``), None where the
    machine does not say (no file, or -1 on a single-node machine)."""
    f = sysfs / "bus" / "pci" / "devices" / pci_bus_id.lower() / "numa_node"
    try:
        node = int(f.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def bind_to_numa_node(node: int, sysfs: pathlib.Path = pathlib.Path("/sys")) -> List[int]:
    """Restricts this process to the CPUs of NUMA node ``node``; returns them ([] and no
    change where the node lists none)."""
    f = sysfs / "devices" / "system" / "node" / f"node{node}" / "cpulist"
    try:
        cpus = parse_cpulist(f.read_text())
    except OSError:
        return []
    if cpus:
        os.sched_setaffinity(0, cpus)
    return cpus


def pci_bus_id(device: int) -> Optional[str]:
    import torch
    p = torch.cuda.get_device_properties(device)
    try:
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except AttributeError:  # an older torch without these fields
        return None


def cap_device_memory(device: int, gib: float) -> None:
    """Lets the caching allocator use at most ``gib`` GiB of the device (lms_swap aims
    under the same cap)."""
    import torch
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * (1 << 30) / total), device)


def wrap(model, engine: str, local_rank: int, **ddp_options):
    """``model`` under DDP (``ddp_options``: DistributedDataParallel's keywords) or under
    FSDP2 (``fully_shard`` on every child that has parameters, then on the root; the
    options unused)."""
    import torch
    if engine == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank],
                                                         **ddp_options)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import fully_shard
    for child in list(model.children()):
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model


def search(args, local_rank: int) -> dict:
    """Largest per-rank batch in [lo, hi) that stock trains with this engine: four steps a
    trial (the optimizer's state exists from the first), bisected to 1/32.  Only in a job
    of one process, where an OOM in one trial cannot leave another rank waiting in a
    collective."""
    import gc
    import torch
    import zoo
    lo, hi = args.search

    def fits(b: int) -> bool:
        model = loss_fn = opt = None
        try:
            torch.manual_seed(0)
            model, loss_fn, _, _ = zoo.build(args.model, b)
            model = wrap(model, args.engine, local_rank)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            for _ in range(4):
                zoo.train_step(lambda: loss_fn(model), opt, contextlib.nullcontext)
            torch.cuda.synchronize()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        model = loss_fn = opt = None
        gc.collect()
        torch.cuda.empty_cache()
        print(f"search {args.model} {args.engine} batch {b}: {'fits' if ok else 'OOM'}", flush=True)
        return ok

    return {"max_batch": zoo.largest_batch(fits, lo, hi)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50", help="a model of benchmarks/zoo.py")
    ap.add_argument("--batch", type=int, help="per-rank batch (required unless --search)")
    ap.add_argument("--engine", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=6, help="steps before timing starts")
    ap.add_argument("--no-lms", action="store_true", help="stock PyTorch: no activation swapping")
    ap.add_argument("--no-numa", action="store_true", help="leave CPU/memory binding to the launcher")
    ap.add_argument("--max-gpu-gib", type=float,
                    help="cap each rank's device memory (torch.cuda.set_per_process_memory_fraction)")
    ap.add_argument("--search", type=int, nargs=2, metavar=("LO", "HI"),
                    help="print stock's largest batch in [LO, HI) and exit (one process only)")
    args = ap.parse_args()
    if args.batch is None and not args.search:
        ap.error("--batch is required (or --search LO HI)")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(local_rank)
    if args.max_gpu_gib:
        cap_device_memory(local_rank, args.max_gpu_gib)
    numa = None
    if not args.no_numa:
        bus = pci_bus_id(local_rank)
        numa = gpu_numa_node(bus) if bus else None
        if numa is not None:
            bind_to_numa_node(numa)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    import zoo
    from children import peak_rss
    if args.search:
        if dist.get_world_size() != 1:
            raise SystemExit("--search runs in a job of one process (torchrun --nproc-per-node 1)")
        print("RESULT " + json.dumps(search(args, local_rank)), flush=True)
        dist.destroy_process_group()
        return

    torch.manual_seed(0)
    model, loss_fn, units, unit = zoo.build(args.model, args.batch)
    model = wrap(model, args.engine, local_rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    lms = None
    if not args.no_lms:
        from lms_swap_loader import load_lms_swap
        lms = load_lms_swap()
    ctx = lms.swapping if lms else contextlib.nullcontext

    out = {"rank": rank, "local_rank": local_rank, "world_size": dist.get_world_size(),
           "numa_node": numa, "engine": args.engine, "model": args.model, "batch": args.batch,
           "lms": bool(lms), "status": "ok"}

    def wrapped_loss():
        # through the DDP wrapper, whose reducer needs its forward (fully_shard works in place)
        return loss_fn(model)

    times = []
    s0 = None
    try:
        for i in range(args.steps):
            if i == args.warmup and lms:
                s0 = lms.stats()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            zoo.train_step(wrapped_loss, opt, ctx)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if rank == 0:
                print(f"STEP {json.dumps({'i': i, 's': round(times[-1], 4)})}", flush=True)
    except torch.OutOfMemoryError as e:  # includes lms_swap's host-limit error
        kind = type(e).__name__
        out["status"] = "host-limit" if kind == "LMSHostMemoryError" else "CUDA OOM"
        out["error"] = str(e).splitlines()[0][:300]
        out["steps_done"] = len(times)
        print("RESULT " + json.dumps(out), flush=True)
        os._exit(1)  # the other ranks wait in a collective: torchrun ends them
    timed = times[args.warmup:] or times
    out.update({"steps": len(times), "step_s": sum(timed) / len(timed),
                "step_times": [round(t, 4) for t in timed],
                "warmup_s": round(sum(times[:args.warmup]), 2),
                "unit": unit, "units_per_s": units * len(timed) / sum(timed),
                "peak_alloc": torch.cuda.max_memory_allocated(),
                "peak_reserved": torch.cuda.max_memory_reserved(),
                "peak_host_rss": peak_rss()})
    if lms:
        s1 = lms.stats()
        n = len(timed)
        out["out_bytes_per_step"] = (s1["swap.out_bytes"] - (s0 or {}).get("swap.out_bytes", 0)) / n
        out["in_bytes_per_step"] = (s1["swap.in_bytes"] - (s0 or {}).get("swap.in_bytes", 0)) / n
        for k in ("host.limit_bytes", "host.peak_reserved_bytes", "guard.evicted_bytes",
                  "guard.ooms_caught", "swap.host_full_kept", "host.pin_ms"):
            out[k] = s1.get(k)
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
