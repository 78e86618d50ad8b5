#!/usr/bin/env python3
"""Benchmark: LMS activation swapping vs stock PyTorch vs stock save_on_cpu, one run.

For each model and each batch (a multiple of the largest batch stock PyTorch fits) it runs
three modes, each in its own subprocess (a crash, a CUDA OOM or the host's OOM killer ends
only that configuration):

  stock          plain training
  save_on_cpu    torch.autograd.graph.save_on_cpu(pin_memory=True) around forward
  lms            lms_swap.swapping() around forward (this repository's layer, default tunables)
  pluggable      lms_swap.allocator: the allocator LMS as PyTorch's (pluggable) CUDA allocator
  pluggable+lms  both: the allocator's LMS under the activation layer (--modes only by name)

A host-memory guard in the parent kills a child when the machine's MemAvailable falls
below --host-guard-gib (what the kernel's OOM killer would otherwise do, maybe to the
parent); that is recorded as "killed (host memory)".

Reported per configuration: throughput, step time, peak device memory (allocated and
reserved), peak host memory (child's RSS high-water mark), and for lms the bytes moved
out/in per step and the fraction of the PCIe bound of FACTS.md:
    bound_step = max(compute_step, S_out / 54 GB/s + S_in / 53 GB/s)
with compute_step = batch / (stock throughput at 1.0x) (the GPU's speed without swapping;
without stock at 1.0x in the same run, the copy term alone).  The run first measures this
host's pinned copy rates (link_rate.py) and reports the fraction of the bound at those
rates as well ("probed"): hosts of the same machine type have differed by 8-10%.

Each run appends one JSON line to ``--record`` (records/zoo.jsonl: run id from LMS_RUN,
date, commit from LMS_COMMIT or git, machine, torch, configuration, every configuration's
counters) and rewrites ``--table`` (RESULTS-zoo.md) from all records; the raw logs go to
``--out`` (outside the tree by default).

    python examples/pytorch/benchmarks/bench_lms_swap.py                  # everything
    python examples/pytorch/benchmarks/bench_lms_swap.py --models resnet50 --scales 1.0 1.5
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/pytorch: lms_swap_loader
sys.path.insert(0, str(HERE))         # zoo

import zoo  # noqa: E402  (the models: unmodified library code)
import device_cap  # noqa: E402
from link_rate import GiB, pinned_rates  # noqa: E402
from budget import Budget, mark_if_cut  # noqa: E402
import children  # noqa: E402
from children import install_stop_handlers, peak_rss, run_process  # noqa: E402
import records  # noqa: E402
from scale_plan import LAYERED, SWAPPING, compiled, runs_at  # noqa: E402
from zoo_report import add_bounds, summary_line, write_markdown, write_table  # noqa: E402
from allocator_memory import alloc_totals, readings  # noqa: E402

RECORD = HERE / "records" / "zoo.jsonl"
TABLE = HERE / "RESULTS-zoo.md"

ALLOC_CONF = None  # PYTORCH_CUDA_ALLOC_CONF for every child (all modes alike)


# ----------------------------------------------------------------------------- models
def build(model_name, batch, args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dev = "cuda"
    if model_name in zoo.MODELS:
        return zoo.build(model_name, batch)
    if model_name == "gpt2":
        d, L, H, V, T = 768, 12, 12, 50257, args.seq_len

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1 = nn.LayerNorm(d)
                self.qkv = nn.Linear(d, 3 * d)
                self.proj = nn.Linear(d, d)
                self.ln2 = nn.LayerNorm(d)
                self.fc = nn.Linear(d, 4 * d)
                self.out = nn.Linear(4 * d, d)

            def forward(self, x):
                B, T_, _ = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(B, T_, 3, H, d // H).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj(a.transpose(1, 2).reshape(B, T_, d))
                return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(V, d)
                self.pos = nn.Embedding(T, d)
                self.blocks = nn.ModuleList(Block() for _ in range(L))
                self.ln = nn.LayerNorm(d)
                self.head = nn.Linear(d, V, bias=False)
                self.head.weight = self.tok.weight

            def forward(self, idx, targets, chunk):
                x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
                for b in self.blocks:
                    x = b(x)
                x = self.ln(x)
                # --loss-chunk N computes the loss over sequence chunks (runs 19-37 did,
                # with 512); the default, 0, is the plain loss over the whole sequence
                chunk = chunk or x.shape[1]
                total = x.new_zeros((), dtype=torch.float32)
                for xs, ts in zip(x.split(chunk, 1), targets.split(chunk, 1)):
                    logits = self.head(xs).float()
                    total = total + F.cross_entropy(logits.reshape(-1, V), ts.reshape(-1),
                                                    reduction="sum")
                return total / targets.numel()

        torch.manual_seed(0)
        model = GPT().to(dev)
        g = torch.Generator(device=dev).manual_seed(0)
        idx = torch.randint(0, V, (batch, T + 1), device=dev, generator=g)

        def loss_fn():
            return model(idx[:, :-1], idx[:, 1:], args.loss_chunk)

        return model, loss_fn, batch * T, "tok/s"
    raise SystemExit(f"unknown model {model_name}")


# ----------------------------------------------------------------------------- child
def parse_lms_options(options):
    """``KEY=VALUE`` strings (``--lms-option``) as lms_swap tunables: numbers where they
    parse as numbers, else strings (e.g. ``policy=never``)."""
    kw = {}
    for opt in options:
        key, _, val = opt.partition("=")
        try:
            kw[key] = float(val) if "." in val else int(val)
        except ValueError:
            kw[key] = val
    return kw


def make_optimizer(model, name):
    import torch
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-4)
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def child(args):
    import torch

    lms = alloc = None
    if args.mode.startswith("pluggable"):
        # before anything is allocated on the GPU: PyTorch refuses to change allocators after
        from lms_swap_loader import load_lms_allocator
        alloc = load_lms_allocator(args.allocator_settings or None)
    cap = device_cap.apply(torch, swapping=args.mode in LAYERED)
    if args.mode in LAYERED:
        from lms_swap_loader import load_lms_swap
        lms = load_lms_swap(prefer_patched=False)
        kw = {}
        if args.prefetch_depth is not None:
            kw["prefetch_depth"] = args.prefetch_depth
        kw.update(parse_lms_options(args.lms_option))
        if kw:
            lms.configure(**kw)
    result = {"model": args.model, "mode": args.mode, "batch": args.batch, "status": "ok"}
    if cap:
        result["device_cap"] = cap

    def ctx():
        if args.mode in ("stock", "pluggable"):
            return contextlib.nullcontext()
        if args.mode == "save_on_cpu":
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
        return lms.swapping()

    per_step = []  # each step's record; an OOM's record keeps those before it
    try:
        model, loss_fn, units, unit_name = build(args.model, args.batch, args)
        opt = make_optimizer(model, args.optimizer)

        def step():
            return zoo.train_step(loss_fn, opt, ctx)

        times = []
        t_start = time.perf_counter()

        def allocator_counters():
            """The pluggable allocator's running page moves and layout after a step: where
            a step starts to move pages, whether its segments or their mapping grew first,
            what its own maps, unmaps and releases' synchronizations cost, and the running
            peak of its device pages beside its LMS limit (the step in which the peak first
            passes the limit is where the limit did not hold)."""
            if not alloc:
                return {}
            ms, st = alloc.memory_stats(), alloc.lms_stats()
            out = alloc_totals(alloc, st)
            out.update({f"alloc.{k}": ms.get(k) for k in (
                "device_reserved_bytes", "peak_device_reserved_bytes", "reserved_bytes",
                "cached_free_bytes", "segments", "map_bytes", "map_ns", "unmap_bytes",
                "unmap_ns", "release_syncs", "release_sync_ns")})
            out["alloc.limit"] = st.get("limit")
            return out

        def policy_counters():
            """lms_swap's running counters after a step (read outside any timing), and the
            pluggable allocator's."""
            if not lms:
                return allocator_counters()
            st = lms.stats()
            return {**allocator_counters(), **{k: st.get(k) for k in (
                "swap.out_bytes", "swap.in_bytes", "swap.fetched_on_demand",
                "guard.evicted_bytes", "swap.guard_fetched",
                "swap.prefetched", "swap.planned_count", "swap.reactive_count",
                "swap.throttle_wait_ms", "swap.tail_kept", "swap.predicted_kept",
                "swap.host_full_kept", "host.reserved_bytes", "host.in_use_bytes",
                "host.evictions", "host.free_ranges", "host.pin_ms",
                "policy.dev0.margin_bytes", "policy.dev0.plan_bytes",
                "policy.dev0.prefetch_reserve_bytes",
                "policy.dev0.forward_end_bytes", "policy.dev0.backward_peak_bytes",
                "policy.dev0.slack_bytes", "host.releasing_bytes",
                # what the allocator held when the net last caught an error
                "guard.ooms_caught", "guard.shared_skipped", "guard.last_oom_request",
                "guard.last_oom_allocated", "guard.last_oom_reserved",
                "guard.last_oom_inactive_split", "guard.last_oom_device_free")}}

        def record(kind, t0):
            rec = {"kind": kind, "s": round(time.perf_counter() - t0, 3),
                   "peak_alloc": readings(alloc)["peak_allocated"],
                   "rss_hwm": peak_rss()}  # the step in which host memory peaked
            rec.update(policy_counters())
            per_step.append(rec)
            print("STEP " + json.dumps(rec), flush=True)

        for i in range(args.warmup):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(("warmup", time.perf_counter() - t_start))
            record("warmup", t0)
        s0 = lms.stats() if lms else None
        a0 = alloc.lms_stats() if alloc else None
        torch.cuda.synchronize()
        step_times = []
        retries = []  # the caching allocator's retries per timed step (each one stalls)
        r0 = readings(alloc)["alloc_retries"]
        t_timed = time.perf_counter()
        while (len(step_times) < args.steps
               or time.perf_counter() - t_timed < args.min_seconds):
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            step_times.append(time.perf_counter() - t0)
            # outside the timing: the step's retries and counters, printed as the warm-up
            # steps' are, so that a run cut in its timed steps shows how far it got
            r1 = readings(alloc)["alloc_retries"]
            retries.append(r1 - r0)
            r0 = r1
            rec = {"kind": "timed", "s": round(step_times[-1], 4), "alloc_retries": retries[-1],
                   **policy_counters()}
            per_step.append(rec)
            print("STEP " + json.dumps(rec), flush=True)
        s1 = lms.stats() if lms else None
        result["per_step"] = per_step
        total = sum(step_times)
        n = len(step_times)
        result.update(
            units_per_s=units * n / total,
            unit=unit_name,
            step_s=total / n,
            timed_steps=n,
            timed_alloc_retries=sum(retries),
            step_times=[round(t, 4) for t in step_times],
            warmup_s=round(times[-1][1], 2) if times else 0,
            loss=float(loss),
        )
        out_b = in_b = 0.0
        if lms:
            out_b += (s1["swap.out_bytes"] - s0["swap.out_bytes"]) / n
            in_b += (s1["swap.in_bytes"] - s0["swap.in_bytes"]) / n
            result["lms_stats"] = {k: v for k, v in s1.items() if v is not None}
        if alloc:  # the allocator's page moves, beside (or instead of) the layer's copies
            a1 = alloc.lms_stats()
            result["alloc_out_bytes_per_step"] = (a1["swap_out_bytes"] - a0["swap_out_bytes"]) / n
            result["alloc_in_bytes_per_step"] = (a1["swap_in_bytes"] - a0["swap_in_bytes"]) / n
            out_b += result["alloc_out_bytes_per_step"]
            in_b += result["alloc_in_bytes_per_step"]
            result["alloc_lms_stats"] = a1
        if lms or alloc:
            result["out_bytes_per_step"], result["in_bytes_per_step"] = out_b, in_b
    except torch.OutOfMemoryError as e:  # includes LMSHostMemoryError
        kind = type(e).__name__
        result["status"] = "host-limit" if kind == "LMSHostMemoryError" else "CUDA OOM"
        result["error"] = str(e).splitlines()[0][:300]
        result["per_step"] = per_step
        # the record keeps the message's start; the log, all of it and the steps before
        print(f"{kind}: {e}", file=sys.stderr, flush=True)
        if alloc:
            print("LMS " + json.dumps(alloc.lms_stats()), file=sys.stderr, flush=True)
    mem = readings(alloc)
    if not alloc:  # the caching allocator's retries, each a stall (the pluggable one has none)
        result["alloc_retries"] = mem["alloc_retries"]
        result["sync_all_streams"] = mem["sync_all_streams"]
    result["peak_alloc"] = mem["peak_allocated"]
    result["peak_reserved"] = mem["peak_reserved"]
    result["peak_host_rss"] = peak_rss()
    result["peak_host_pages"] = mem["host_pages_peak"]
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- parent
def run_child(argv, timeout, guard_bytes, log, on_result=None):
    """One child of this file; ``on_result`` as run_process has it (before a stop of
    the bench ends it)."""
    env = dict(os.environ)
    if ALLOC_CONF:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF

    model = argv[argv.index("--model") + 1] if "--model" in argv else None
    settled = {}

    def got(res):
        # one process: its RESULT is the row itself, also where the timeout hit a
        # configuration's child while it exited
        if model is None:
            res.pop("results", None)
            res.pop("steps_seen", None)
            settled.update(res)
        else:
            settled.update(children.finished_before_cut(res, "model", model))
        if on_result is not None:
            on_result(settled)
    run_process([sys.executable, __file__, "--child"] + argv, timeout, guard_bytes, log, env,
                on_result=got)
    return settled


def search_max_batch(model, args, log, lo, hi):
    """Largest batch in [lo, hi) that stock trains (four steps: the optimizer's state
    exists from the first, and the caching allocator's layout has settled by the
    fourth), found in one child."""
    argv = ["--model", model, "--search", str(lo), str(hi), "--seq-len", str(args.seq_len),
            "--image-size", str(args.image_size), "--loss-chunk", str(args.loss_chunk),
            "--optimizer", args.optimizer]
    r = run_child(argv, args.search_timeout, int(args.host_guard_gib * GiB), log)
    return r.get("max_batch")


def child_search(args):
    import torch
    device_cap.apply(torch)
    lo, hi = args.search

    def fits(b):
        try:
            model, loss_fn, _, _ = build(args.model, b, args)
            opt = make_optimizer(model, args.optimizer)
            for _ in range(4):
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn()
                loss.backward()
                opt.step()
            torch.cuda.synchronize()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        model = loss_fn = opt = loss = None
        gc.collect()
        torch.cuda.empty_cache()
        print(f"search {args.model} batch {b}: {'fits' if ok else 'OOM'}", flush=True)
        return ok

    print("RESULT " + json.dumps({"max_batch": zoo.largest_batch(fits, lo, hi)}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--search", type=int, nargs=2, help=argparse.SUPPRESS)
    children.add_compile_option(ap)
    ap.add_argument("--mode", choices=["stock", "save_on_cpu", *SWAPPING])
    ap.add_argument("--batch", type=int)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--models", nargs="+", default=list(zoo.MODELS),
                    help=f"zoo models ({', '.join(zoo.MODELS)}) or gpt2 (the runs 19-37 decoder)")
    ap.add_argument("--modes", nargs="+", default=["stock", "save_on_cpu", "lms"])
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--baseline-scales", type=float, nargs="+", default=[1.0],
                    help="scales at which stock and save_on_cpu run (stock does not fit above "
                         "1.0x by the search; save_on_cpu was killed by host memory at 1.0x)")
    ap.add_argument("--lms-scales", type=float, nargs="+", default=None,
                    help="scales at which the swapping modes run (default: all of --scales); "
                         "--scales 1.0 1.5 --lms-scales 1.5 runs stock at 1.0x for the bound "
                         "and the swapping modes at 1.5x only")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                    help="the same for every model (runs 19-37: sgd with momentum)")
    ap.add_argument("--base-batch", action="append", default=[], metavar="MODEL=N",
                    help="stock's largest batch for MODEL, found earlier (default: searched)")
    ap.add_argument("--resnet-batch", type=int, default=0,
                    help="largest batch stock fits for resnet50 (0 = search)")
    ap.add_argument("--gpt2-batch", type=int, default=0, help="same for gpt2 (0 = search)")
    ap.add_argument("--gpt2-search", type=int, nargs=2, default=[8, 64], metavar=("LO", "HI"),
                    help="gpt2 batch search range: LO must fit, HI must not (default 8 64)")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--loss-chunk", type=int, default=0,
                    help="gpt2: tokens per chunk of the loss (0 = the whole sequence at once)")
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--alloc-conf", default="expandable_segments:True",
                    help="PYTORCH_CUDA_ALLOC_CONF for all modes alike ('' = PyTorch's default)")
    ap.add_argument("--steps", type=int, default=14, help="timed steps, at least")
    ap.add_argument("--min-seconds", type=float, default=0.0,
                    help="time steps until this many seconds have passed as well (the "
                         "caching allocator's layout may take ~15 steps to settle)")
    ap.add_argument("--prefetch-depth", type=int, default=None)
    ap.add_argument("--lms-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an lms_swap tunable for the lms mode (repeatable), e.g. "
                         "device_limit_fraction=0.95")
    ap.add_argument("--allocator-settings", default="", metavar="SETTINGS",
                    help="the pluggable modes' allocator LMS settings, as "
                         "lms_swap.allocator.enable takes them (e.g. 'lms_defrag:True')")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per configuration")
    ap.add_argument("--save-on-cpu-timeout", type=float, default=None,
                    help="seconds per save_on_cpu configuration (default: --timeout; it was "
                         "killed by host memory or too slow for 20 steps on every model so far)")
    ap.add_argument("--search-timeout", type=float, default=300.0,
                    help="seconds for one model's batch search")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for the whole run; a configuration starts only while what "
                         "is left covers the longest one finished so far")
    ap.add_argument("--host-guard-gib", type=float, default=6.0)
    device_cap.add_option(ap)
    ap.add_argument("--link-probe-gib", type=float, default=2.0,
                    help="GiB per copy when measuring this host's pinned copy rates before "
                         "the configurations (0: not measured)")
    ap.add_argument("--probe-link", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(pathlib.Path(tempfile.gettempdir()) / "bench_lms_swap"),
                    help="folder of this run's raw log, results.json and results.md")
    ap.add_argument("--record", default=str(RECORD), help="JSON Lines file to append to")
    ap.add_argument("--table", default=str(TABLE), help="markdown table to rewrite")
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite the table from the records, run nothing")
    args = ap.parse_args()
    device_cap.pass_to_children(args.device_gib, args.device_hold)
    if args.table_only:
        write_table(pathlib.Path(args.table), records.load(args.record))
        return 0

    if args.child:
        if args.compile:
            return children.compile_child(args.compile)
        if args.probe_link:
            import torch
            rates = pinned_rates(int(args.link_probe_gib * GiB))
            print(f"link {torch.cuda.get_device_name()}: {rates}", flush=True)
            print("RESULT " + json.dumps(rates), flush=True)
            return 0
        if args.search:
            return child_search(args)
        return child(args)

    global ALLOC_CONF
    ALLOC_CONF = args.alloc_conf
    install_stop_handlers()
    budget = Budget(args.budget, floor=20.0)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "bench_log.txt", "w")
    results = []
    cmd = " ".join([os.path.basename(sys.executable)] + [str(pathlib.Path(a)) for a in sys.argv])
    given = {k: int(v) for k, _, v in (b.partition("=") for b in args.base_batch)}
    link = None
    if args.link_probe_gib > 0:
        r = run_child(["--probe-link", "--link-probe-gib", str(args.link_probe_gib)], 120,
                      int(args.host_guard_gib * GiB), log)
        if "d2h_gbps" in r:
            link = {k: r[k] for k in ("d2h_gbps", "h2d_gbps", "both_ways_gbps_each")}
        print(f"link (pinned copies, GB/s): {link or 'not measured: ' + str(r.get('status'))}",
              flush=True)
        log.write(f"link: {link or r}\n")
    compiles = children.compile_first(
        compiled(args.modes), args.compile_s, budget.left,
        lambda w, t: run_child([children.COMPILE_FLAG, w], t, int(args.host_guard_gib * GiB), log))
    for what, got in compiles.items():
        log.write(f"{what}: {got}\n")
    recorded = []
    running = []  # the row of the configuration whose child runs now

    def finish(row, res, stock_rate):
        """A configuration's row, complete with what its child reported."""
        row.update({k: v for k, v in res.items() if k not in row})
        if "steps_seen" in row:  # a cut run's step records go with the others' traces
            row["per_step"] = row.pop("steps_seen")
        if row["mode"] in SWAPPING and row.get("status") == "ok":
            add_bounds(row, stock_rate, link)
        results.append(row)

    def cut_short(row, res, stock_rate):
        # a configuration running when the bench was told to stop: it (cut, or finished
        # just then) and those before it are recorded before the bench goes (before the
        # child's end, which can take long)
        if children.stopping() or str(res.get("status", "")).startswith("stopped"):
            finish(row, res, stock_rate)
            write_results(args, out, cmd, link, results)
            recorded.append(True)

    try:
        for model in args.models:
            base = given.get(model) or (args.resnet_batch if model == "resnet50" else
                                        args.gpt2_batch if model == "gpt2" else 0)
            if not base:
                lo, hi = zoo.SEARCH.get(model) or tuple(args.gpt2_search)
                base = search_max_batch(model, args, log, lo, hi)
                print(f"[{model}] largest stock batch: {base}", flush=True)
                if not base:
                    continue
            stock_rate = None
            dead = {}  # mode -> reason it failed at a smaller batch
            for scale in args.scales:
                batch = max(1, int(round(base * scale)))
                for mode in args.modes:
                    if not runs_at(mode, scale, args.baseline_scales, args.lms_scales):
                        continue
                    row = {"model": model, "scale": scale, "batch": batch, "mode": mode}
                    if mode in dead:
                        row.update(status=f"skipped ({dead[mode]} at a smaller batch)")
                    elif (refused := budget.refusal()):
                        row.update(status=refused)
                    else:
                        argv = ["--model", model, "--mode", mode, "--batch", str(batch),
                                "--warmup", str(args.warmup), "--steps", str(args.steps),
                                "--min-seconds", str(args.min_seconds),
                                "--image-size", str(args.image_size), "--seq-len", str(args.seq_len),
                                "--loss-chunk", str(args.loss_chunk), "--optimizer", args.optimizer]
                        if args.prefetch_depth is not None:
                            argv += ["--prefetch-depth", str(args.prefetch_depth)]
                        for opt in args.lms_option:
                            argv += ["--lms-option", opt]
                        if args.allocator_settings:
                            argv += ["--allocator-settings", args.allocator_settings]
                        cap = args.timeout
                        if mode == "save_on_cpu" and args.save_on_cpu_timeout:
                            cap = args.save_on_cpu_timeout
                        # the budget bounds the whole run, the last configuration included
                        timeout = min(cap, budget.left())
                        running[:] = [row, stock_rate]

                        def landed(res, row=row, rate=stock_rate, limit=timeout, cap=cap):
                            mark_if_cut(row, res, limit, cap)  # a cut says the budget made it
                            cut_short(row, res, rate)
                        r = run_child(argv, timeout, int(args.host_guard_gib * GiB), log,
                                      on_result=landed)
                        running.clear()
                        row.update({k: v for k, v in r.items() if k not in row})
                        budget.finished(r)
                        if row["status"] != "ok":
                            dead[mode] = row["status"]
                    if mode == "stock" and scale == 1.0 and row.get("status") == "ok":
                        stock_rate = row["units_per_s"]
                    finish(row, {}, stock_rate)
                    print(summary_line(row), flush=True)
                    with open(out / "results.json", "w") as f:
                        json.dump({"command": cmd, "link": link, "results": results}, f, indent=1)
    except SystemExit as e:
        if not recorded:  # stopped between two configurations, or in a batch search
            cut = getattr(e, "result", None)  # children.Stopped: the child's result
            if cut is not None and running and running[0] not in results:
                # the stop came after the result had been handed over
                finish(running[0], cut, running[1])
            write_results(args, out, cmd, link, results)
        raise
    write_results(args, out, cmd, link, results)
    print(f"total wall {budget.elapsed():.0f}s", flush=True)


def write_results(args, out, cmd, link, results):
    """This run's results.md, its record (with its per-step traces beside it) and the
    table rewritten from every record."""
    write_markdown(out / "results.md", cmd, results, args, link)
    config = {k: v for k, v in vars(args).items()
              if k not in ("child", "search", "mode", "batch", "model", "probe_link", "out",
                           "record", "table", "table_only")}
    records.append_with_traces(args.record, {**records.header(), "command": cmd, "config": config,
                                             "link": link, "results": results})
    write_table(pathlib.Path(args.table), records.load(args.record))


if __name__ == "__main__":
    main()
