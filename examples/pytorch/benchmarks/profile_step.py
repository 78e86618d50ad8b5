"""Where does a training step lose time? One profiled step of a benchmark model.

Builds a model of bench_lms_swap.py (same code, same data), runs warm-up steps (LMS
learns its plan there), times a few steps by phase on the GPU (CUDA events between
forward, backward and the optimizer step), then profiles one step with
torch.profiler and prints:

* the CUDA runtime calls that block the CPU (cudaStreamSynchronize: the caching
  allocator freeing its cache and retrying an allocation; cudaEventSynchronize: waits
  on copies) with the autograd op they ran in,
* the idle gaps over 0.3 ms on the compute stream (time the GPU waited for the CPU),
* the copies on the side streams (LMS swapping out and in).

    python3 examples/pytorch/benchmarks/profile_step.py --model unet --batch 626 --mode lms --out /tmp/p

``--loop NAME`` profiles a loop of loops.py (bench_loops.py's) instead of a zoo model, its
iterations numbered on from the warm-up (a loop whose shapes cycle profiles the iteration
that comes next); ``--device-gib h100`` holds it to the H100's size as the benchmarks do.

Run it on the GPU machine; the gzipped Chrome trace lands in --out, and ``--record
records/probes.jsonl`` appends the figures as one JSON line (RESULTS-probes.md shows it).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import pathlib
import shutil
import sys
import time
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _ms(us: float) -> float:
    return round(us / 1e3, 1)


def analyse(trace_path: str) -> dict:
    """Prints what blocked the CPU, where the compute stream idled and what the side
    streams copied, and returns the same figures (times in ms from the step's first event)
    for the run's record."""
    with gzip.open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in events)
    out: dict = {"blocking": {}, "phases": {}, "side_streams": []}
    for s in (e for e in events if "Synchronize" in e["name"]):
        inside = [e for e in events if e.get("tid") == s.get("tid") and e is not s
                  and e["ts"] <= s["ts"] and e["ts"] + e["dur"] >= s["ts"] + s["dur"]]
        inside.sort(key=lambda e: -e["dur"])
        where = inside[-1]["name"][:60] if inside else "-"
        print(f"BLOCKING {s['name']} at {(s['ts'] - t0) / 1e3:.1f} ms for "
              f"{s['dur'] / 1e3:.1f} ms in {where}")
        # by call and the op it ran in: how many, how long, from when to when
        g = out["blocking"].setdefault(f"{s['name']} in {where}", {
            "count": 0, "ms": 0.0, "from_ms": _ms(s["ts"] - t0), "to_ms": 0.0})
        g["count"] += 1
        g["ms"] = round(g["ms"] + s["dur"] / 1e3, 1)
        g["to_ms"] = _ms(s["ts"] + s["dur"] - t0)
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    streams: dict = {}
    for e in gpu:
        streams.setdefault(e["args"].get("stream"), []).append(e)
    compute = max(streams.values(), key=len)
    compute.sort(key=lambda e: e["ts"])
    # The step's phases: main() wraps forward, backward and the optimizer step in
    # record_function ranges on the CPU.  A kernel or copy belongs to the phase in whose
    # CPU range it was launched (its runtime call, found by correlation id: backward's
    # launches come from autograd's thread, inside the main thread's backward range).
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"][4:]) for e in events
                    if e["name"] in ("lms_forward", "lms_backward", "lms_optimizer")
                    and e.get("cat") == "user_annotation")
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}

    def within(spans, ts):
        for a, b, name in spans:
            if a <= ts < b:
                return name
        return "-"

    def phase(e):
        ts = launched.get(e["args"].get("correlation"))
        return within(ranges, ts) if ts is not None else "-"

    # each phase's span on the GPU: first start to last end of what it launched
    phases = []
    for name in ("forward", "backward", "optimizer"):
        mine = [e for e in gpu if phase(e) == name]
        if mine:
            phases.append((min(e["ts"] for e in mine),
                           max(e["ts"] + e["dur"] for e in mine), name))

    gaps = [(a["ts"] + a["dur"], b["ts"] - a["ts"] - a["dur"])
            for a, b in zip(compute, compute[1:]) if b["ts"] - a["ts"] - a["dur"] > 300]
    busy = sum(e["dur"] for e in compute)
    span = compute[-1]["ts"] + compute[-1]["dur"] - compute[0]["ts"]
    gaps_us = sum(g for _, g in gaps)
    print(f"COMPUTE stream busy {busy / 1e3:.1f} ms of {span / 1e3:.1f} ms; "
          f"{len(gaps)} gaps over 0.3 ms, {gaps_us / 1e3:.1f} ms in all")
    out["compute"] = {"busy_ms": _ms(busy), "span_ms": _ms(span), "gaps": len(gaps),
                      "gaps_ms": _ms(gaps_us), "largest_gaps": [
                          [_ms(at - t0), _ms(g), within(phases, at)]
                          for at, g in sorted(gaps, key=lambda x: -x[1])[:10]]}
    for a, b, name in phases:
        pbusy = sum(e["dur"] for e in compute if phase(e) == name)
        pg = sum(g for at, g in gaps if a <= at < b)
        print(f"PHASE {name} on the GPU: {(b - a) / 1e3:.1f} ms (from {(a - t0) / 1e3:.1f} ms), "
              f"compute busy {pbusy / 1e3:.1f} ms, compute gaps {pg / 1e3:.1f} ms")
        out["phases"][name] = {"span_ms": _ms(b - a), "from_ms": _ms(a - t0),
                               "busy_ms": _ms(pbusy), "gaps_ms": _ms(pg)}
    for at, g in sorted(gaps, key=lambda x: -x[1])[:25]:
        print(f"  gap at {(at - t0) / 1e3:.1f} ms ({within(phases, at)}): {g / 1e3:.2f} ms")
    for sid, es in streams.items():
        if es is compute:
            continue
        copies = [e for e in es if e.get("cat") == "gpu_memcpy"]
        if copies:
            first = min(e["ts"] for e in copies) - t0
            last = max(e["ts"] + e["dur"] for e in copies) - t0
            nbytes = sum(int(e["args"].get("bytes", 0)) for e in copies)
            dur = sum(e["dur"] for e in copies)
            print(f"SIDE stream {sid}: {len(copies)} copies, {nbytes / 1e9:.1f} GB, "
                  f"{dur / 1e3:.1f} ms busy ({nbytes / max(dur, 1) / 1e3:.1f} GB/s), "
                  f"from {first / 1e3:.1f} to {last / 1e3:.1f} ms")
            side = {"stream": sid, "copies": len(copies), "gb": round(nbytes / 1e9, 2),
                    "busy_ms": _ms(dur), "gb_s": round(nbytes / max(dur, 1) / 1e3, 1),
                    "from_ms": _ms(first), "to_ms": _ms(last), "phases": {}, "launched": {}}
            out["side_streams"].append(side)
            copies.sort(key=lambda e: e["ts"])
            for a, b, name in phases:
                # the copy engine's idle time inside the phase's GPU span, and its
                # longest idle stretches (what the copies waited for)
                inside = [e for e in copies if e["ts"] < b and e["ts"] + e["dur"] > a]
                idle = [(x["ts"] + x["dur"], y["ts"] - x["ts"] - x["dur"])
                        for x, y in zip(inside, inside[1:])
                        if y["ts"] - x["ts"] - x["dur"] > 100]
                if inside:
                    head = inside[0]["ts"] - a
                    tail = b - inside[-1]["ts"] - inside[-1]["dur"]
                    cbusy = sum(e["dur"] for e in inside)
                    cidle = sum(g for _, g in idle)
                    print(f"    in {name}'s span: copies busy {cbusy / 1e3:.1f} ms, idle over "
                          f"0.1 ms {cidle / 1e3:.1f} ms in {len(idle)} stretches, "
                          f"{head / 1e3:.1f} ms before the first, {tail / 1e3:.1f} ms after "
                          f"the last")
                    for at, g in sorted(idle, key=lambda x: -x[1])[:8]:
                        print(f"      idle at {(at - t0) / 1e3:.1f} ms: {g / 1e3:.2f} ms")
                    side["phases"][name] = {
                        "busy_ms": _ms(cbusy), "idle_ms": _ms(cidle),
                        "before_first_ms": _ms(head), "after_last_ms": _ms(tail)}
            for name in ("forward", "backward", "optimizer"):
                mine = [e for e in copies if phase(e) == name]
                if mine:
                    mbytes = sum(int(e["args"].get("bytes", 0)) for e in mine)
                    mdur = sum(e["dur"] for e in mine)
                    print(f"    launched in {name}: {len(mine)} copies, "
                          f"{mbytes / 1e9:.1f} GB, {mdur / 1e3:.1f} ms")
                    side["launched"][name] = {"copies": len(mine),
                                              "gb": round(mbytes / 1e9, 2), "ms": _ms(mdur)}
    return out


def main() -> int:
    # the benchmarks' allocator for every mode, set before torch is imported (not at this
    # module's import: a test that imports analyse() keeps its own environment)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import bench_lms_swap as bench
    import device_cap
    import loops

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="unet", choices=bench.zoo.MODELS + ("gpt2",))
    ap.add_argument("--loop", choices=loops.LOOPS,
                    help="profile this loop of loops.py instead of --model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--mode", default="lms", choices=("stock", "lms"))
    ap.add_argument("--lms-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"),
                    help="as bench_lms_swap.py (the zoo runs use adamw)")
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--timed", type=int, default=4,
                    help="steps timed by phase on the GPU (events) before the profiled one")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--loss-chunk", type=int, default=512)
    ap.add_argument("--max-gpu-gib", type=float,
                    help="cap the device memory the caching allocator may use (as ddp_lms.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", metavar="PATH",
                    help="append the run's figures as one JSON line (records/probes.jsonl's "
                         "form: run id from LMS_RUN, date, commit, machine, torch, the data)")
    device_cap.add_option(ap)
    a = ap.parse_args()
    device_cap.pass_to_children(a.device_gib, a.device_hold)  # read back by apply() in this process

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from lms_swap_loader import load_lms_swap

    if a.max_gpu_gib:
        from ddp_lms import cap_device_memory
        cap_device_memory(0, a.max_gpu_gib)
    device_cap.apply(torch)
    print(f"THREADS intra-op {torch.get_num_threads()}", flush=True)
    lms = None
    if a.mode == "lms":
        lms = load_lms_swap(prefer_patched=False)
        kw = bench.parse_lms_options(a.lms_option)
        if kw:
            lms.configure(**kw)
    def ctx():
        return lms.swapping() if lms else contextlib.nullcontext()

    if a.loop:
        loop = loops.build(a.loop, a.batch)

        def run(i, phase):
            loop.step(i, ctx, phase)
    else:
        shapes = types.SimpleNamespace(image_size=a.image_size, seq_len=a.seq_len,
                                       loss_chunk=a.loss_chunk)
        model, loss_fn, _units, _unit = bench.build(a.model, a.batch, shapes)
        opt = bench.make_optimizer(model, a.optimizer)

        def run(i, phase):
            bench.zoo.train_step(loss_fn, opt, ctx, phase)

    timed = []  # each timed step's phases on the GPU, its time, peak and allocator retries

    def step(i, phases=False):
        """One step (iteration ``i``), each phase in a record_function range (the trace's
        phases); with ``phases``, CUDA events on the compute stream split its GPU time
        into forward, backward and optimizer (no added sync; a phase that comes more than
        once, as in gradient accumulation, sums its spans)."""
        spans = []
        retries = {}

        @contextlib.contextmanager
        def phase(name):
            with record_function("lms_" + name):
                if not phases:
                    yield
                    return
                begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                before = torch.cuda.memory_stats().get("num_alloc_retries", 0)
                begin.record()
                yield
                end.record()
                spans.append((name, begin, end))
                retries[name] = (retries.get(name, 0) + torch.cuda.memory_stats().get(
                    "num_alloc_retries", 0) - before)

        t0 = time.perf_counter()
        run(i, phase)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        if phases:
            took = {}
            for name, begin, end in spans:
                took[name] = took.get(name, 0.0) + begin.elapsed_time(end) / 1e3
            peak = torch.cuda.max_memory_allocated() / 2**30
            print("PHASES gpu " + ", ".join(f"{n} {s:.3f} s" for n, s in took.items())
                  + f"; step {t1 - t0:.3f} s; peak {peak:.1f} GiB; allocator retries "
                  f"{retries}", flush=True)
            timed.append({"gpu_s": {n: round(s, 4) for n, s in took.items()},
                          "step_s": round(t1 - t0, 4), "peak_gib": round(peak, 2),
                          "alloc_retries": retries})

    warmup = []
    for i in range(a.warmup):
        t0 = time.perf_counter()
        step(i)
        warmup.append(round(time.perf_counter() - t0, 3))
        print(f"WARMUP {i} {warmup[-1]:.3f} s", flush=True)
    for i in range(a.warmup, a.warmup + a.timed):
        torch.cuda.reset_peak_memory_stats()
        step(i, phases=True)
    if lms:
        print("POLICY", json.dumps({k: v for k, v in lms.stats().items()
                                    if k.startswith(("policy.", "host."))}))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(a.warmup + a.timed)
    os.makedirs(a.out, exist_ok=True)
    raw = os.path.join(a.out, f"trace_{a.loop or a.model}_{a.mode}.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))
    profiled = analyse(raw + ".gz")
    stats = lms.stats() if lms else {}
    if lms:
        print("LMS", json.dumps({k: v for k, v in stats.items() if k.startswith("swap.")}))
    if a.record:
        import records
        what = a.loop or a.model
        records.append(a.record, {
            **records.header(), "probe": f"profile_{what}_{a.batch}_{a.mode}",
            "data": {"command": "python " + " ".join(
                         [os.path.basename(__file__)] + sys.argv[1:]),
                     "profile": {"what": what, "batch": a.batch, "mode": a.mode,
                                 "lms_options": a.lms_option, "warmup_s": warmup,
                                 "timed": timed, "profiled_step": profiled,
                                 "lms_stats": {k: v for k, v in stats.items()
                                               if v is not None}}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
