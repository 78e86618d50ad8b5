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


def watch_layers(model, torch, seen: list, reached=None) -> int:
    """Hooks each layer of ``model`` (a child of a ModuleList or Sequential that has
    parameters) so that, as backward reaches the layer's output, ``seen`` gets the layer's
    name and the device allocation then (and ``reached(name)`` is called, where given).
    Returns how many layers are watched."""
    count = 0
    for full, layer in _watched_names(model, torch):
        def hook(_mod, _args, out, full=full):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(t, torch.Tensor) and t.requires_grad:
                def at_grad(_g, full=full):
                    seen.append([full, round(torch.cuda.memory_allocated() / GB, 2)])
                    if reached is not None:
                        reached(full)
                t.register_hook(at_grad)
        layer.register_forward_hook(hook)
        count += 1
    return count


def site(frames: list, torch_dir: str) -> str:
    """Where a block was allocated, from its frames (innermost first): the innermost two
    outside torch's own files (those under ``torch_dir``, torch's package folder: a
    library installed beside it, in a folder whose path names torch as well, counts as
    the caller's), marked where the allocation came from a checkpoint's recomputation;
    "(no Python frame)" for what backward's kernels allocate."""
    inside = os.path.join(torch_dir, "")
    own = [f for f in frames if not f.get("filename", "").startswith(inside)]
    where = " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"
                       for f in own[:2]) or "(no Python frame)"
    if any("recompute" in f.get("name", "") for f in frames):
        where += " [recomputed]"
    return where


def live_blocks(snapshot: dict, torch_dir: str) -> list:
    """(address, bytes, site) of each block in use in a ``torch.cuda.memory._snapshot()``
    (:func:`site`, ``torch_dir`` its torch's package folder)."""
    return [(b["address"], b["size"], site(b.get("frames") or [], torch_dir))
            for seg in snapshot.get("segments", []) for b in seg.get("blocks", [])
            if b.get("state") == "active_allocated"]


def live_summary(at_forward_end: list, now: list, top: int = 15) -> dict:
    """The blocks live ``now`` (:func:`live_blocks`), in GB: in all, those also live at
    forward's end (the same address and size), and the ``top`` groups by (forward's or
    backward's, site), largest first, each with its block count and commonest sizes."""
    old = {(a, n) for a, n, _ in at_forward_end}
    groups = {}
    for a, n, where in now:
        g = groups.setdefault(("forward" if (a, n) in old else "backward", where),
                              {"bytes": 0, "blocks": 0, "sizes": {}})
        g["bytes"] += n
        g["blocks"] += 1
        g["sizes"][n] = g["sizes"].get(n, 0) + 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])[:top]
    return {"live_gb": round(sum(n for _, n, _ in now) / GB, 2),
            "from_forward_gb": round(sum(n for a, n, _ in now if (a, n) in old) / GB, 2),
            "groups": [{"when": when, "site": where, "gb": round(g["bytes"] / GB, 2),
                        "blocks": g["blocks"],
                        "sizes_gb": [[round(n / GB, 3), c] for n, c in
                                     sorted(g["sizes"].items(), key=lambda x: -x[0] * x[1])[:3]]}
                       for (when, where), g in rows]}


def _print_live(summary: dict, layer: str) -> None:
    print(f"live as backward reached {layer}: {summary['live_gb']} GB, "
          f"{summary['from_forward_gb']} GB of it live at forward's end; by site:", flush=True)
    for g in summary["groups"]:
        sizes = ", ".join(f"{c} x {n}" for n, c in g["sizes_gb"])
        print(f"  {g['gb']:7.2f} GB  {g['blocks']:4d} blocks ({sizes} GB)  {g['when']:8s} "
              f"{g['site']}", flush=True)


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


def _watched_names(model, torch):
    """(name, layer) of the layers :func:`watch_layers` hooks, in the model's order."""
    stacks = (torch.nn.ModuleList, torch.nn.Sequential)
    for parent_name, parent in model.named_modules():
        if isinstance(parent, stacks):
            for name, layer in parent.named_children():
                if next(layer.parameters(), None) is not None:
                    yield (f"{parent_name}.{name}" if parent_name else name), layer


def _live_now(torch) -> list:
    """:func:`live_blocks` of the caching allocator as it is now."""
    return live_blocks(torch.cuda.memory._snapshot(), os.path.dirname(torch.__file__))


def _at_forward_end(model, torch, live: dict):
    """Takes the live blocks into ``live["forward_end"]`` as the model's forward returns
    (a Hugging Face model's loss included; a zoo model's loss comes after), once.  Returns
    the hook's handle."""
    def hook(_mod, _args, _out):
        if live.get("forward_end") is None:
            live["forward_end"] = _live_now(torch)
    return model.register_forward_hook(hook)


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
    ap.add_argument("--live-step", type=int, metavar="N",
                    help="say what is allocated, and where it was allocated, as backward of "
                         "step N reaches --live-layer")
    ap.add_argument("--live-layer", metavar="NAME",
                    help="the layer (as the watched layers are named, e.g. model.layers.0); "
                         "default: the last one backward reaches")
    ap.add_argument("--record", metavar="PATH",
                    help="append the run's figures as one JSON line (records/probes.jsonl's form)")
    device_cap.add_option(ap)
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps must be at least 2: a backward's record ends in the next step")
    if a.live_step is not None and not 0 <= a.live_step < a.steps:
        ap.error(f"--live-step must be a step of the run, 0 to {a.steps - 1}")
    if a.live_layer is not None and a.live_step is None:
        ap.error("--live-layer needs --live-step")
    import bench_lms_swap as bench
    try:  # refused here, before the GPU is touched
        kw = bench.parse_lms_options(a.lms_option)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    device_cap.pass_to_children(a.device_gib, a.device_hold)

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
    layers_seen, live = [], {}
    names = [n for n, _ in _watched_names(model, torch)]
    if a.live_step is not None and not names:
        raise SystemExit("--live-step: the model has no layers to watch (no ModuleList or "
                         "Sequential with parameters)")
    if a.live_layer is not None and a.live_layer not in names:
        raise SystemExit(f"--live-layer {a.live_layer!r} is not a watched layer; they are: "
                         + ", ".join(names))
    # the snapshot is taken once, at --live-layer or, by default, at the first layer of the
    # stacks (the last that backward reaches)
    target = a.live_layer or (names[0] if names else None)

    def reached(name):
        if live.get("armed") and name == target:
            live["armed"] = False
            live["at"] = _live_now(torch)
    watched = watch_layers(model, torch, layers_seen,
                           reached if a.live_step is not None else None)
    print(f"{watched} layers watched", flush=True)

    steps, before = [], {}
    for i in range(a.steps):
        at[0] = i
        layers_seen.clear()
        if i == a.live_step:
            torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
            live["armed"] = True
            live["forward_end"] = None
            forward_end = _at_forward_end(model, torch, live)
        t0 = time.perf_counter()
        run(i)
        torch.cuda.synchronize()
        if i == a.live_step:
            forward_end.remove()
            torch.cuda.memory._record_memory_history(enabled=None)
            if live.get("at") is not None:
                live["summary"] = live_summary(live.get("forward_end") or [], live["at"])
                _print_live(live["summary"], target)
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
    if a.live_step is not None and live.get("summary") is None:
        print(f"--live-step {a.live_step}: backward never reached {target}", flush=True)
    if a.record:
        import records
        what = a.loop or a.model
        records.append(a.record, {
            **records.header(), "probe": f"backward_memory_{what}_{a.batch}_{a.mode}",
            "data": {"command": "python " + " ".join([os.path.basename(__file__)] + sys.argv[1:]),
                     "backward_memory": {"what": what, "batch": a.batch, "mode": a.mode,
                                         "lms_options": a.lms_option, "steps": steps,
                                         "backwards": summaries,
                                         "live": live.get("summary"),
                                         "live_step": a.live_step,
                                         "live_layer": target,
                                         "last_intervals": [b["intervals"] for b in done[-2:]]}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
