"""Where does backward's memory go?  One loop or zoo model under LMS activation swapping,
backward cut into intervals as the forecast cuts it (one at each unpack of a swapped tensor).

For each step's backward it prints, and with ``--record`` keeps: forward's end (where
backward began), the interval before the first unpack (the loss's gradients), the interval
with the highest peak (its forward offset: bytes forward had saved before the tensor whose
unpack began it), the last interval, the range of the levels the intervals began at, and
what was swapped, prefetched and fetched on demand.  The margin the forecast learns is
backward's highest peak less forward's end; this shows which interval set it and whether that
peak moves with what forward kept (the interval before the first unpack does) or not (one near
backward's end, on a level backward built up itself).

    python3 examples/pytorch/benchmarks/backward_memory.py --loop ckpt-some --batch 48 \\
        --steps 10 --device-gib h100 --record examples/pytorch/benchmarks/records/probes.jsonl

``--model NAME`` takes a zoo model of bench_lms_swap.py instead of a loop.  The intervals of
the last two backwards are kept whole in the record.  Each step also keeps the device
allocation as backward reaches each layer (the layers of the model's ModuleLists and
Sequentials, read by a hook on each layer's output), under ``--mode lms`` as under ``--mode
stock`` (plain training, no intervals), so that what backward holds on to can be told apart
from what the swapping holds.  Run it on the GPU machine, with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` as the benchmarks set it.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pathlib
import sys
import time
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import device_cap  # noqa: E402

GB = 1e9
COUNTERS = ("swap.out_bytes", "swap.prefetched", "swap.fetched_on_demand",
            "swap.prefetched_by_lesson")


def backwards(events):
    """The observer's events (lms_swap.backward_profile.observe), each with the step it came
    in, as one dict per backward: its step, where it began and its intervals in order, each
    with its offset, level and peak.  (A step may run several backwards, gradient
    accumulation, or none, an evaluation pass.)"""
    out = []
    for kind, f, step in events:
        if kind == "begin":
            out.append({"step": step, "level": f["level"], "intervals": [], "ended": False})
        elif out and kind == "interval":
            out[-1]["intervals"].append(f)
        elif out and kind == "end":
            out[-1]["ended"] = True
            out[-1]["peak"] = f["peak"]
    return out


def summary(bwd: dict) -> dict:
    """One backward's figures, in GB: forward's end; the first interval's peak (before the
    first unpack, where the interval closed at once its peak is forward's end) and the
    highest interval (its index, forward offset, level, peak, bytes ahead); the last
    interval's level and peak; the lowest and highest level an interval began at."""
    iv = bwd["intervals"]
    if not iv:
        return {"step": bwd.get("step"), "forward_end_gb": round(bwd["level"] / GB, 2),
                "intervals": 0}
    top = max(range(len(iv)), key=lambda j: iv[j]["peak"])

    def gb(x):
        return round(x / GB, 2)

    return {"step": bwd.get("step"), "forward_end_gb": gb(bwd["level"]), "intervals": len(iv),
            "first_peak_gb": gb(iv[0]["peak"]),
            "highest": {"index": top, "offset_gb": None if iv[top]["key"] is None
                        else gb(iv[top]["key"]), "level_gb": gb(iv[top]["level"]),
                        "peak_gb": gb(iv[top]["peak"]), "ahead_gb": gb(iv[top]["ahead"])},
            "over_forward_end_gb": gb(iv[top]["peak"] - bwd["level"]),
            "last": {"level_gb": gb(iv[-1]["level"]), "peak_gb": gb(iv[-1]["peak"])},
            "levels_gb": [gb(min(x["level"] for x in iv)), gb(max(x["level"] for x in iv))]}


def watch_layers(model, torch, seen: list) -> int:
    """Hooks each layer of ``model`` (a child of a ModuleList or Sequential that has
    parameters) so that, as backward reaches the layer's output, ``seen`` gets the layer's
    name and the device allocation then.  Returns how many layers are watched."""
    stacks = (torch.nn.ModuleList, torch.nn.Sequential)
    count = 0
    for parent_name, parent in model.named_modules():
        if not isinstance(parent, stacks):
            continue
        for name, layer in parent.named_children():
            if next(layer.parameters(), None) is None:
                continue
            full = f"{parent_name}.{name}" if parent_name else name

            def hook(_mod, _args, out, full=full):
                t = out[0] if isinstance(out, (tuple, list)) else out
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda _g: seen.append(
                        [full, round(torch.cuda.memory_allocated() / GB, 2)]))
            layer.register_forward_hook(hook)
            count += 1
    return count


def line(s: dict, moved: dict) -> str:
    """A backward's summary, with its step's counters (``moved``), as one printed line."""
    i = s.get("step")
    if not s.get("intervals"):
        return f"step {i}: no intervals (nothing swapped came back)"
    h = s["highest"]
    where = "before the first unpack" if h["offset_gb"] is None else f"at offset {h['offset_gb']} GB"
    return (f"step {i}: forward end {s['forward_end_gb']} GB, first interval's peak "
            f"{s['first_peak_gb']}, highest {h['peak_gb']} (interval {h['index']} of "
            f"{s['intervals']}, {where}, level {h['level_gb']}, ahead {h['ahead_gb']}; "
            f"{s['over_forward_end_gb']} over forward's end), last {s['last']['peak_gb']} "
            f"on {s['last']['level_gb']}, levels {s['levels_gb'][0]}-{s['levels_gb'][1]} | "
            f"swapped {moved.get('swap.out_bytes', 0) / GB:.1f} GB, prefetched "
            f"{moved.get('swap.prefetched', 0)}, on demand {moved.get('swap.fetched_on_demand', 0)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--loop", help="a loop of loops.py (bench_loops.py's)")
    what.add_argument("--model", help="a zoo model of bench_lms_swap.py")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--mode", choices=("lms", "stock"), default="lms",
                    help="lms: under lms_swap.swapping (the intervals and the layers); stock: "
                         "plain training (the layers only)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lms-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an lms_swap tunable (repeatable), as the benchmarks take it")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--loss-chunk", type=int, default=512)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--record", metavar="PATH",
                    help="append the run's figures as one JSON line (records/probes.jsonl's form)")
    device_cap.add_option(ap)
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps must be at least 2: a backward's record ends in the next step")
    import bench_lms_swap as bench
    try:  # refused here, before the GPU is touched
        kw = bench.parse_lms_options(a.lms_option)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    device_cap.pass_to_children(a.device_gib)

    import torch
    import loops
    from lms_swap_loader import load_lms_swap

    device_cap.apply(torch)
    events, at = [], [0]
    profile = lms = None
    ctx = contextlib.nullcontext
    if a.mode == "lms":
        lms = load_lms_swap(prefer_patched=False)
        if kw:
            lms.configure(**kw)
        ctx = lms.swapping
        profile = importlib.import_module(lms.__name__ + ".backward_profile")
        profile.observe(lambda kind, f: events.append((kind, f, at[0])))
    if a.loop:
        loop = loops.build(a.loop, a.batch)
        model = loop.model

        def run(i):
            loop.step(i, ctx)
    else:
        shapes = types.SimpleNamespace(image_size=a.image_size, seq_len=a.seq_len,
                                       loss_chunk=a.loss_chunk)
        model, loss_fn, _, _ = bench.build(a.model, a.batch, shapes)
        opt = bench.make_optimizer(model, a.optimizer)

        def run(i):
            bench.zoo.train_step(loss_fn, opt, ctx)
    layers_seen = []
    watched = watch_layers(model, torch, layers_seen)
    print(f"{watched} layers watched", flush=True)

    steps, before = [], {}
    for i in range(a.steps):
        at[0] = i
        layers_seen.clear()
        t0 = time.perf_counter()
        run(i)
        torch.cuda.synchronize()
        now = lms.stats() if lms else {}
        moved = {k: int(now.get(k) or 0) - before.get(k, 0) for k in COUNTERS}
        before = {k: int(now.get(k) or 0) for k in COUNTERS}
        steps.append({"i": i, "s": round(time.perf_counter() - t0, 3), **moved,
                      "policy": {k: v for k, v in now.items() if k.startswith("policy.")},
                      "layers": list(layers_seen)})
        levels = [x[1] for x in layers_seen]
        print(f"step {i} {steps[-1]['s']:.2f} s; allocated as backward reached each layer: "
              + (f"first {levels[0]}, lowest {min(levels)}, highest {max(levels)}, last "
                 f"{levels[-1]} GB ({len(levels)} layers)" if levels else "no layer reached"),
              flush=True)
    if profile is not None:
        profile.observe(None)
    # each backward's record ends as the next step's forward begins: the last one's never
    done = [b for b in backwards(events) if b["ended"]]
    summaries = [summary(b) for b in done]
    for s in summaries:
        st = steps[s["step"]]
        print(line(s, st), f"| {st['s']:.2f} s", flush=True)
    if a.record:
        import records
        what = a.loop or a.model
        records.append(a.record, {
            **records.header(), "probe": f"backward_memory_{what}_{a.batch}_{a.mode}",
            "data": {"command": "python " + " ".join([os.path.basename(__file__)] + sys.argv[1:]),
                     "backward_memory": {"what": what, "batch": a.batch, "mode": a.mode,
                                         "lms_options": a.lms_option, "steps": steps,
                                         "backwards": summaries,
                                         "last_intervals": [b["intervals"] for b in done[-2:]]}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
