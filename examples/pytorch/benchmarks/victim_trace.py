"""Which blocks should LMS move out?  A replayed trace of a real training step, with victim policies
compared on it.

``record`` runs an unmodified zoo model (zoo.py: library models built from configs, AdamW, bf16
autocast) for a warm-up step, then one more step under a dispatch-level tracer that writes, op by
op, which device storages each op used, which it created, and which died after it (storage weak
references polled after every op).  Parameters, gradients and optimizer state made before the
traced step enter the trace when first used.

``simulate`` replays that trace on a device of a given capacity (a fraction of the step's peak of
live bytes) with whole-block moves: a block an op needs that is on the host comes back first; room
is made by moving blocks out that the current op does not use, chosen by

- ``alloc-order``: least recently allocated first (what both allocator patches do today, without
  touches: weights and optimizer state, made first, go first);
- ``use-lru``: least recently used first (what the allocator could do if the framework told it
  about every use);
- ``next-use``: the block whose next use is farthest away first (Belady's choice).  A step repeats
  the previous step's op sequence, so this is what a policy that learned the previous step knows;
  in PyTorch the autograd graph and the activation layer's pack order give the same order;
- ``free-order``: the block whose free is farthest away first, blocks that outlive the step
  first of all.  An allocator sees mallocs and frees but no uses: this is what it could learn
  from the previous step on its own;
- ``free-order-kept-last``: the same, but blocks that outlive the step (weights, optimizer
  state) go last, in allocation order;
- ``framework-classes``: what the framework knows of each block without watching its uses
  (block_classes): first the blocks needed at the optimizer step (its state, the gradients),
  then the tensors saved for the backward pass, earliest saved first (needed last), then the
  rest, each class in allocation order;

and prints the bytes moved out and in per policy, with the PCIe-bound time of those moves
(FACTS.md: 54 GB/s out, 53 GB/s in).  Whole blocks, no partial pages, no compute overlap: it
compares the policies' choices, not a run of the allocator.

    python victim_trace.py record --model llama --batch 4 --out trace.json.gz   # GPU machine
    python victim_trace.py simulate trace.json.gz --capacity 0.8,0.67,0.5       # anywhere
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import heapq
import json
import os
import sys
import time
from typing import Dict, List, Optional

POLICIES = ("alloc-order", "use-lru", "next-use", "free-order", "free-order-kept-last",
            "framework-classes")
OUT_BPS, IN_BPS = 54e9, 53e9  # FACTS.md: device->pinned host, pinned host->device


# ----------------------------------------------------------------------------------- recording
def record_step(step, device_type: str = "cuda") -> dict:
    """Runs ``step()`` under the tracer; returns the trace: ``{"ops": [[name, uses, news, dead],
    ...], "sizes": {id: bytes}, "pre": [ids]}``, block ids numbered in order of first appearance;
    ``pre``: blocks that existed before the step (first seen as an op's input)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    live: Dict[int, tuple] = {}        # data_ptr -> (id, weak ref)
    sizes: Dict[int, int] = {}
    ops: List[list] = []
    pre: List[int] = []

    def block(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        ent = live.get(ptr)
        if ent is not None and ent[1].expired():
            ent = None
        if ent is None:
            bid = len(sizes)
            sizes[bid] = s.nbytes()
            live[ptr] = (bid, StorageWeakRef(s))
            return bid, True
        return ent[0], False

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ins = [a for a in tree_flatten((args, kwargs))[0]
                   if isinstance(a, torch.Tensor) and a.device.type == device_type]
            uses, news = [], []
            for t in ins:
                bid, new = block(t)
                if new:                       # an input never seen: made before the step
                    pre.append(bid)
                uses.append(bid)
            out = func(*args, **kwargs)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == device_type:
                    bid, new = block(t)
                    (news if new else uses).append(bid)
            dead = []
            for ptr, (bid, ref) in list(live.items()):
                if ref.expired():
                    dead.append(bid)
                    del live[ptr]
            ops.append([str(func.__name__), sorted(set(uses)), sorted(set(news)), dead])
            return out

    with Tracer():
        step()
    return {"ops": ops, "sizes": {str(k): v for k, v in sizes.items()}, "pre": pre}


def cmd_record(args) -> None:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zoo
    model, loss_fn, _units, _unit = zoo.build(args.model, args.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctx = contextlib.nullcontext
    zoo.train_step(loss_fn, opt, ctx)              # warm-up: optimizer state exists
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.time()
    trace = record_step(lambda: zoo.train_step(loss_fn, opt, ctx))
    torch.cuda.synchronize()
    trace["meta"] = {"model": args.model, "batch": args.batch, "torch": torch.__version__,
                     "allocated_before": base, "peak_allocated": torch.cuda.max_memory_allocated(),
                     "record_s": round(time.time() - t0, 1)}
    with gzip.open(args.out, "wt") as f:
        json.dump(trace, f)
    print(f"{args.model} batch {args.batch}: {len(trace['ops'])} ops, {len(trace['sizes'])} blocks, "
          f"peak allocated {trace['meta']['peak_allocated'] / 2**30:.1f} GiB -> {args.out}")


# ---------------------------------------------------------------------------------- simulation
def peak_live_bytes(trace: dict) -> int:
    """The step's peak of live bytes as the trace sees it (blocks made before the step are live
    from its start; every block an op uses or makes is live during the op)."""
    sizes = {int(k): v for k, v in trace["sizes"].items()}
    live = peak = sum(sizes[b] for b in trace.get("pre", []))
    for _name, _uses, news, dead in trace["ops"]:
        live += sum(sizes[b] for b in news)
        peak = max(peak, live)
        live -= sum(sizes[b] for b in dead)
    return peak


def phases(trace: dict) -> tuple:
    """(first backward op, first optimizer op) of a traced step: the backward pass starts with
    the loss's seed gradient, the last ``ones_like`` before the first ``*backward*`` op (some
    backward formulas, a mean's for one, run as plain ops), or that op where there is none;
    AdamW's update at its first ``_foreach_`` op (foreach is its default on CUDA); len(ops)
    where the step has none."""
    names = [op[0] for op in trace["ops"]]
    n = len(names)
    bwd = next((i for i, nm in enumerate(names) if "backward" in nm), n)
    bwd = next((i for i in range(bwd - 1, -1, -1) if names[i].startswith("ones_like")), bwd)
    opt = next((i for i, nm in enumerate(names) if nm.startswith("_foreach_") and i > bwd), n)
    return bwd, opt


def block_classes(trace: dict) -> Dict[int, int]:
    """What the framework knows about each block without watching uses, as victim classes:
    0, needed at the optimizer step (the optimizer's state; gradients, which autograd makes in
    the backward pass for the step); 1, saved in the forward pass for the backward pass (the
    activation layer's pack hook sees them); blocks not listed: the rest (parameters,
    temporaries).  The replay reads the classes off the trace's phases."""
    bwd, opt = phases(trace)
    first: Dict[int, int] = {}
    last: Dict[int, int] = {}
    made: Dict[int, int] = {}
    for i, (_n, uses, news, _d) in enumerate(trace["ops"]):
        for b in news:
            made[b] = i
        for b in news + uses:
            first.setdefault(b, i)
            last[b] = i
    pre = set(trace.get("pre", []))
    out: Dict[int, int] = {}
    for b, f in first.items():
        if b in pre:
            if f >= opt:
                out[b] = 0                       # optimizer state
        elif made.get(b, -1) < bwd <= last[b]:
            out[b] = 1                           # saved for the backward pass
        elif bwd <= made.get(b, -1) < opt <= last[b]:
            out[b] = 0                           # a gradient
    return out


def simulate(trace: dict, capacity: int, policy: str) -> dict:
    """Replays the trace on a device of ``capacity`` bytes; returns bytes moved out and in, the
    number of moves, and ops that could not run (their blocks alone exceed the capacity)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    sizes = {int(k): v for k, v in trace["sizes"].items()}
    ops = trace["ops"]
    # next uses of every block, in op order (made and used both count as a use)
    uses_at: Dict[int, List[int]] = {}
    for i, (_n, uses, news, _d) in enumerate(ops):
        for b in news + uses:
            uses_at.setdefault(b, []).append(i)
    cursor = {b: 0 for b in uses_at}
    INF = len(ops) + 1
    # when each block dies (INF: it outlives the step): what an allocator that
    # saw the previous step's mallocs and frees can predict without seeing uses
    dies_at: Dict[int, int] = {}
    for i, (_n, _u, _nw, dead) in enumerate(ops):
        for b in dead:
            dies_at[b] = i

    def next_use(b, i):
        lst, k = uses_at.get(b, []), cursor.get(b, 0)
        while k < len(lst) and lst[k] <= i:
            k += 1
        cursor[b] = k
        return lst[k] if k < len(lst) else INF

    on_dev: Dict[int, None] = {}      # blocks on the device
    on_host: Dict[int, None] = {}
    alloc_time: Dict[int, int] = {}
    last_use: Dict[int, int] = {}
    heap: list = []                   # (key, stamp, block): lazily invalidated
    stamp: Dict[int, int] = {}
    used = 0
    out_b = in_b = moves = stuck = 0

    klass = block_classes(trace) if policy == "framework-classes" else {}
    big = 4 * (len(ops) + len(sizes) + 2)

    def key(b, i):
        if policy == "framework-classes":   # needed at the optimizer step, then saved, then the rest
            c = klass.get(b, 2)
            return c * big + alloc_time[b] + len(sizes) + 1
        if policy == "alloc-order":
            return alloc_time[b]
        if policy == "use-lru":
            return last_use[b]
        if policy == "free-order":           # farthest predicted free first
            return -dies_at.get(b, INF)
        if policy == "free-order-kept-last":  # the same; blocks that outlive the step last
            d = dies_at.get(b)
            return -d if d is not None else INF + alloc_time[b]
        return -next_use(b, i)

    def push(b, i):
        stamp[b] = stamp.get(b, 0) + 1
        heapq.heappush(heap, (key(b, i), stamp[b], b))

    def make_room(need, pinned, i):
        nonlocal used, out_b, moves
        held = []
        while used + need > capacity and heap:
            k, st, b = heapq.heappop(heap)
            if b not in on_dev or stamp.get(b) != st:
                continue
            if policy == "next-use":      # keys go stale as the step advances: refresh once
                fresh = key(b, i)
                if fresh != k:
                    heapq.heappush(heap, (fresh, st, b))
                    continue
            if b in pinned:
                held.append((k, st, b))
                continue
            del on_dev[b]
            on_host[b] = None
            used -= sizes[b]
            out_b += sizes[b]
            moves += 1
        for h in held:
            heapq.heappush(heap, h)
        return used + need <= capacity

    # blocks made before the step: on the device at its start, oldest first
    for b in trace.get("pre", []):
        if not make_room(sizes[b], (), -1):
            stuck += 1
        on_dev[b] = None
        used += sizes[b]
        alloc_time[b] = -1 - len(sizes) + b
        last_use[b] = alloc_time[b]
        push(b, -1)
    for i, (_n, uses, news, dead) in enumerate(ops):
        pinned = set(uses) | set(news)
        for b in uses:
            if b in on_host:
                if not make_room(sizes[b], pinned, i):
                    stuck += 1
                del on_host[b]
                on_dev[b] = None
                used += sizes[b]
                in_b += sizes[b]
                moves += 1
        for b in news:
            if not make_room(sizes[b], pinned, i):
                stuck += 1
            on_dev[b] = None
            used += sizes[b]
            alloc_time[b] = i
        for b in pinned:
            last_use[b] = i
            if b in on_dev:
                push(b, i)
        for b in dead:
            if b in on_dev:
                del on_dev[b]
                used -= sizes[b]
            on_host.pop(b, None)
    return {"policy": policy, "capacity": capacity, "bytes_out": out_b, "bytes_in": in_b,
            "moves": moves, "ops_over_capacity": stuck,
            "pcie_s": out_b / OUT_BPS + in_b / IN_BPS}


def cmd_simulate(args) -> None:
    with gzip.open(args.trace, "rt") as f:
        trace = json.load(f)
    peak = peak_live_bytes(trace)
    meta = trace.get("meta", {})
    print(f"trace {args.trace}: {meta.get('model', '?')} batch {meta.get('batch', '?')}, "
          f"{len(trace['ops'])} ops, {len(trace['sizes'])} blocks, peak live {peak / 2**30:.2f} GiB")
    rows = []
    for frac in [float(x) for x in args.capacity.split(",")]:
        cap = int(peak * frac)
        res = {p: simulate(trace, cap, p) for p in POLICIES}
        base = res["alloc-order"]["bytes_out"] + res["alloc-order"]["bytes_in"]
        for p in POLICIES:
            r = res[p]
            moved = r["bytes_out"] + r["bytes_in"]
            r["fraction"] = frac
            r["moved_vs_alloc_order"] = moved / base if base else None
            rows.append(r)
            rel = f"{moved / base:.2f}" if base else "-"
            print(f"  capacity {frac:.2f} x peak ({cap / 2**30:.2f} GiB) {p:12s} out "
                  f"{r['bytes_out'] / 2**30:7.2f} GiB  in {r['bytes_in'] / 2**30:7.2f} GiB  "
                  f"PCIe {r['pcie_s']:6.3f} s  moved vs alloc-order {rel}"
                  + (f"  ops over capacity {r['ops_over_capacity']}" if r["ops_over_capacity"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "peak_live": peak, "rows": rows}, f, indent=1)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="trace one training step of a zoo model (needs a GPU)")
    r.add_argument("--model", default="llama")
    r.add_argument("--batch", type=int, default=4)
    r.add_argument("--out", required=True, help="trace file (.json.gz)")
    s = sub.add_parser("simulate", help="replay a trace under each victim policy")
    s.add_argument("trace")
    s.add_argument("--capacity", default="0.8,0.67,0.5",
                   help="device capacities as fractions of the step's peak of live bytes")
    s.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    (cmd_record if args.cmd == "record" else cmd_simulate)(args)


if __name__ == "__main__":
    main()
