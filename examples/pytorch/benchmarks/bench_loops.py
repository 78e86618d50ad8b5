#!/usr/bin/env python3
"""Benchmark: the training loops people run (loops.py), stock vs save_on_cpu vs torchtune's
OffloadActivations vs LMS activation swapping, at multiples of stock's largest batch.

Each configuration runs in its own child process (children.py: a crash, a CUDA OOM or the
host's OOM killer ends only that configuration) for ``--steps`` iterations, the first
``--warmup`` of them untimed; every iteration must pass.  Modes (the same defaults for
every loop, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` for all):

  stock        plain training
  save_on_cpu  torch.autograd.graph.save_on_cpu(pin_memory=True) around forward
  torchtune    torchtune.training.OffloadActivations() around forward, where it loads
  lms          lms_swap.swapping() around forward (this repository's layer, defaults)
  pluggable    lms_swap.allocator (the allocator LMS as PyTorch's CUDA allocator), no layer
  pluggable+lms  both (the allocator's LMS under the layer); --modes runs these by name only

Per timed iteration the child records its time and, for lms, the bytes moved each way and
the eviction net's interventions.  The bound of an iteration is
``max(compute, S_out / 54 GB/s + S_in / 53 GB/s)`` (FACTS.md), with compute = stock's time
for the same iteration at 1.0x scaled by the units processed; a run's fraction of the
bound is the sum of its iterations' bounds over the sum of their times.

Each run appends one JSON line per configuration to ``--record`` (run id from LMS_RUN, date,
commit, machine, torch, configuration, every counter; the per-iteration counter lines go
beside it, gzipped, in ``<record>-per-step.jsonl.gz``) and rewrites the table ``--table``
from all records of the commit it ran; nobody copies figures by hand.

    python bench_loops.py --loops ckpt-decoder varlen-decoder --scales 1.0 1.5 2.0
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/pytorch: lms_swap_loader
sys.path.insert(0, str(HERE))

from budget import Budget, mark_if_cut  # noqa: E402
import children  # noqa: E402
from children import (finished_before_cut, install_stop_handlers, peak_rss,  # noqa: E402
                      run_process)
from link_rate import FACTS_RATES, GiB, pcie_step_s  # noqa: E402
import records as records_  # noqa: E402
import device_cap  # noqa: E402
from allocator_memory import alloc_totals, host_gib, readings  # noqa: E402
from scale_plan import LAYERED, SWAPPING, compiled, runs_at  # noqa: E402

ALLOC_CONF = "expandable_segments:True"
RECORD = HERE / "records" / "loops.jsonl"
TABLE = HERE / "RESULTS-loops.md"
LMS_COUNTERS = ("swap.out_bytes", "swap.in_bytes", "guard.evicted_count", "guard.evicted_bytes",
                "guard.ooms_caught", "swap.fetched_on_demand", "swap.guard_fetched",
                "swap.planned_count", "swap.reactive_count", "swap.chunked_losses",
                "swap.profile_exact", "swap.profile_scaled", "swap.forwards_abandoned",
                "swap.backward_saves", "swap.prefetched", "guard.host_bytes", "host.pin_ms",
                "host.evictions", "swap.guard_forward_bytes", "swap.guard_backward_bytes",
                "swap.plan_base_raises", "swap.plan_raises_undone", "swap.throttle_waits",
                "swap.inflight_bounded", "swap.throttle_wait_ms")
LMS_LEVELS = ("policy.dev0.margin_bytes", "policy.dev0.plan_bytes", "policy.dev0.slack_bytes",
              "policy.dev0.forward_end_bytes", "policy.dev0.backward_peak_bytes",
              "policy.dev0.step_base_bytes", "policy.dev0.base_extra_bytes",
              "policy.dev0.device_limit_bytes", "host.in_use_bytes", "host.reserved_bytes",
              # the allocator when the net last caught an out-of-memory error: short of
              # memory (allocated near the limit) or of pieces (reserved far above it)
              "guard.last_oom_request", "guard.last_oom_allocated", "guard.last_oom_reserved",
              "guard.last_oom_inactive_split")


# ----------------------------------------------------------------------------- child
def load_torchtune_offload():
    """torchtune's OffloadActivations class: from the installed package, else from its
    module file alone (torchtune's package imports its data stack, which the GPU machine
    lacks; the offloading module needs only torch, torchao and TiedLinear)."""
    try:
        from torchtune.training import OffloadActivations
        return OffloadActivations, "torchtune package"
    except Exception as e:  # noqa: BLE001  (what failed is reported in the record)
        first = f"{type(e).__name__}: {e}"
    import importlib.util
    import types
    root = None
    for base in sys.path:
        cand = pathlib.Path(base) / "torchtune" / "training" / "_activation_offloading.py"
        if cand.is_file():
            root = cand.parents[1]
            break
    if root is None:
        raise RuntimeError(f"torchtune not importable ({first}) and its files not found")
    pkg = types.ModuleType("torchtune")
    pkg.__path__ = [str(root)]
    sys.modules.setdefault("torchtune", pkg)
    mods = types.ModuleType("torchtune.modules")
    spec = importlib.util.spec_from_file_location("torchtune.modules.tied_linear",
                                                  root / "modules" / "tied_linear.py")
    tl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tl)
    mods.TiedLinear = tl.TiedLinear
    sys.modules["torchtune.modules"] = mods
    nf4 = _nf4_tensor_where_missing()
    spec = importlib.util.spec_from_file_location(
        "torchtune.training._activation_offloading", root / "training" / "_activation_offloading.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    how = f"module file alone (package: {first[:120]})"
    return mod.OffloadActivations, how + (f"; {nf4}" if nf4 else "")


def _nf4_tensor_where_missing():
    """torchtune's offloading module imports torchao's ``NF4Tensor`` only to warn when an NF4
    weight meets a torchao too old to offload it; these loops hold no NF4 tensor.  Where that
    import fails (torchao 0.18 has the class elsewhere; 0.12, which has it there, did not
    import on torch 2.13), a class of that name that nothing is an instance of stands in, and
    the record says so.  Returns that note, or "" where the real class imports."""
    import types
    try:
        from torchao.dtypes.nf4tensor import NF4Tensor  # noqa: F401
        return ""
    except Exception as e:  # noqa: BLE001  (named in the record)
        why = f"{type(e).__name__}: {e}"
    try:
        import torchao
    except Exception:  # noqa: BLE001
        torchao = types.ModuleType("torchao")
        torchao.__version__ = "0"
        sys.modules["torchao"] = torchao
    dtypes = types.ModuleType("torchao.dtypes.nf4tensor")
    dtypes.NF4Tensor = type("NF4Tensor", (), {})
    sys.modules["torchao.dtypes.nf4tensor"] = dtypes
    return f"torchao's NF4Tensor stood in ({why[:100]})"


def child(args):
    import torch
    import loops

    result = {"loop": args.loop, "mode": args.mode, "batch": args.batch, "status": "ok"}
    lms = alloc = None
    if args.mode.startswith("pluggable"):
        # before anything is allocated on the GPU: PyTorch refuses to change allocators after
        from lms_swap_loader import load_lms_allocator
        alloc = load_lms_allocator(args.allocator_settings or None)
    cap = device_cap.apply(torch, swapping=args.mode in LAYERED)
    if cap:
        result["device_cap"] = cap
    if args.mode in LAYERED:
        from lms_swap_loader import load_lms_swap
        lms = load_lms_swap(prefer_patched=False)
        if args.lms_option:
            from bench_lms_swap import parse_lms_options
            lms.configure(**parse_lms_options(args.lms_option))
        ctx = lms.swapping
    elif args.mode == "save_on_cpu":
        def ctx():
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
    elif args.mode == "torchtune":
        cls, how = load_torchtune_offload()
        result["torchtune_loaded_from"] = how
        ctx = cls
    else:
        ctx = contextlib.nullcontext

    def counters():
        # the caching allocator's retries: each released its cache, which waits for
        # every copy still queued (the loop's compute stands still meanwhile); a pluggable
        # allocator has none (its LMS's moves are its counters)
        if alloc is not None:
            out = alloc_totals(alloc)
        else:
            out = {"alloc_retries": int(readings()["alloc_retries"])}
        if lms is not None:
            st = lms.stats()
            out.update({k: int(st.get(k) or 0) for k in LMS_COUNTERS})
        return out

    steps = []
    try:
        loop = loops.build(args.loop, args.batch)
        result["unit"] = loop.unit
        before = counters()
        for i in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            kind, units = loop.step(i, ctx)
            torch.cuda.synchronize()
            took = time.perf_counter() - t0
            mem = readings(alloc)
            rec = {"i": i, "kind": kind, "units": units, "s": took, "timed": i >= args.warmup,
                   "alloc_end": mem["allocated"], "reserved_end": mem["reserved"]}
            now = counters()
            rec.update({k: now[k] - before.get(k, 0) for k in now})
            before = now
            if lms is not None:
                st = lms.stats()
                rec.update({k: st.get(k) for k in LMS_LEVELS})
            steps.append(rec)
            print("STEP " + json.dumps(rec), flush=True)
    except torch.OutOfMemoryError as e:
        kind = type(e).__name__
        result["status"] = "host-limit" if kind == "LMSHostMemoryError" else "CUDA OOM"
        result["error"] = str(e)[:2000]
    except Exception as e:  # noqa: BLE001  (a loop that breaks is a result, not a crash)
        result["status"] = f"error: {type(e).__name__}"
        result["error"] = str(e)[:2000]
    if lms is not None:  # what the layer had done, also where the loop failed
        result["lms_stats"] = {k: v for k, v in lms.stats().items() if v is not None}
    result["steps"] = steps
    result["steps_done"] = len(steps)
    mem = readings(alloc)
    result["peak_alloc"], result["peak_reserved"] = mem["peak_allocated"], mem["peak_reserved"]
    result["peak_host_rss"] = peak_rss()
    result["peak_host_pages"] = mem["host_pages_peak"]
    print("RESULT " + json.dumps(result), flush=True)


def child_fits(args):
    import torch
    import loops
    device_cap.apply(torch)
    print(f"FITS {int(loops.fits(args.loop, args.fits))}", flush=True)


def child_search(args):
    """Stock's largest batch, each probe in a process of its own (in its process group,
    which the harness kills on a timeout): an out-of-memory error inside non-reentrant
    checkpointing left memory held in the process that probed, and every later probe
    there failed (on the H100 a search for ckpt-some found 4 where 8 trains with
    nothing moved)."""
    import zoo
    lo, hi = args.search

    def fits(batch):
        p = subprocess.run([sys.executable, __file__, "--child", "--loop", args.loop,
                            "--fits", str(batch)], capture_output=True, text=True)
        m = re.search(r"^FITS ([01])$", p.stdout, re.M)
        if m is None:
            raise RuntimeError(f"the probe at batch {batch} gave no answer (exit "
                               f"{p.returncode}): {p.stderr[-1500:]}")
        print(f"PROBE {args.loop} batch {batch}: {'fits' if m.group(1) == '1' else 'CUDA OOM'}",
              flush=True)
        return m.group(1) == "1"

    best = zoo.largest_batch(fits, lo, hi)
    print("RESULT " + json.dumps({"max_batch": best}), flush=True)


# ----------------------------------------------------------------------------- parent
def add_bound(row, stock_row):
    """Fraction of the PCIe bound (in place), iteration by iteration against stock's same
    iteration at 1.0x."""
    if row.get("status") != "ok":
        return
    row.update(bound_figures(row["steps"], stock_row))


def bound_figures(steps, stock_row) -> dict:
    """The figures of the timed iterations among ``steps``: time, units per second, the
    fraction of the bound (each iteration against stock's same iteration at 1.0x in
    ``stock_row``, else the copy term alone), the net's interventions, bytes each way."""
    timed = [s for s in steps if s["timed"]]
    base = {s["i"]: s for s in (stock_row or {}).get("steps", [])}
    total_s = sum(s["s"] for s in timed)
    bound = copy = 0.0
    for s in timed:
        # every byte moved: the layer's planned copies, the net's synchronous ones, the
        # allocator LMS's page moves
        c = pcie_step_s(_out_bytes(s), _in_bytes(s), FACTS_RATES)
        b = base.get(s["i"])
        comp = b["s"] * s["units"] / b["units"] if b else 0.0
        bound += max(comp, c)
        copy += c
    return {"timed_s": total_s,
            "units_per_s": sum(s["units"] for s in timed) / total_s if total_s else None,
            "bound_has_compute": bool(base),
            "frac_of_bound": bound / total_s if total_s else None,
            "copy_s": copy,
            "net_interventions": sum(s.get("guard.ooms_caught", 0) for s in timed),
            "net_interventions_all": sum(s.get("guard.ooms_caught", 0) for s in steps),
            "out_gb_per_iter": sum(map(_out_bytes, timed)) / max(1, len(timed)) / 1e9,
            "in_gb_per_iter": sum(map(_in_bytes, timed)) / max(1, len(timed)) / 1e9}


def lms_variants(given):
    """``--lms-variant`` strings as lists of KEY=VALUE tunables, one list per variant
    (``[[]]``, the defaults alone, where none is given)."""
    out = []
    for v in given or ["defaults"]:
        opts = [] if v.strip() == "defaults" else [o.strip() for o in v.split(",") if o.strip()]
        bad = [o for o in opts if "=" not in o or not o.partition("=")[0]]
        if bad or (not opts and v.strip() != "defaults"):
            raise ValueError(f"--lms-variant {v!r}: give KEY=VALUE[,KEY=VALUE...] or 'defaults'")
        out.append(opts)
    if len({tuple(o) for o in out}) != len(out):
        raise ValueError("--lms-variant: the same variant twice")
    return out


def cut_figures(row, stock_row):
    """For a run the harness cut in its timed iterations: the figures of the timed
    iterations it finished (``steps_seen``), with their count; None otherwise.  Kept in
    the row, as ``cut_figures``, because the per-iteration lines go beside the record."""
    timed = sum(1 for s in row.get("steps_seen") or () if s.get("timed"))
    if not timed or not records_.cut_by_timeout(row, "iterations"):
        return None
    return {"timed": timed, **bound_figures(row["steps_seen"], stock_row)}


def _cut_run_figures(r, unit: str) -> str:
    """A cut run's ``cut_figures`` in words, named as its timed iterations' ("; its 21
    timed iterations: 78.0% of the bound, ..."), throughput in ``unit`` (a cut child never
    printed its own); "" where it has none."""
    f = r.get("cut_figures")
    if not f:
        return ""
    frac = f["frac_of_bound"]
    return (f"; its {f['timed']} timed iteration{'s' if f['timed'] != 1 else ''}: "
            + (f"{100 * frac:.1f}%{'' if f['bound_has_compute'] else '*'} of the bound, "
               if frac else "")
            + f"{f['units_per_s']:.0f} {unit}, "
            f"net {f['net_interventions']}, "
            f"{f['out_gb_per_iter']:.1f} / {f['in_gb_per_iter']:.1f} GB each way")


def _out_bytes(s):
    return (s.get("swap.out_bytes", 0) + s.get("guard.evicted_bytes", 0)
            + s.get("alloc.swap_out_bytes", 0))


def _in_bytes(s):
    return s.get("swap.in_bytes", 0) + s.get("alloc.swap_in_bytes", 0)


def _is_stock_base(r):
    """Whether ``r`` is a stock run at 1.0x that trained: what the others are measured by."""
    return r["mode"] == "stock" and r["scale"] == 1.0 and r.get("status") == "ok"


def _stock_of_each(records):
    """id(record) -> the stock 1.0x row it is compared with: its loop's, of the same commit
    on the same GPU (the same code on the same card), the latest before it, else the first
    after it; absent where there is none."""
    def key(r):
        return r["loop"], r.get("commit"), records_.gpu_label(r.get("machine"))

    out = {}
    for order in (records, list(reversed(records))):
        seen = {}
        for r in order:
            if _is_stock_base(r):
                seen[key(r)] = r
            if id(r) not in out and key(r) in seen:
                out[id(r)] = seen[key(r)]
    return out


def write_table(path, records):
    """The table of every record, one section per commit, the newest first."""
    head = [
        "# Training loops: stock vs save_on_cpu vs torchtune vs LMS activation swapping", "",
        "Written by bench_loops.py from `records/loops.jsonl` (one JSON line per "
        "configuration: commit, machine, torch, command, every counter; each iteration's "
        "counters in `records/loops-per-step.jsonl.gz`).", "",
        "Fraction of bound: sum over timed iterations of max(stock's time for the same "
        "iteration at 1.0x in the same run, scaled by units; bytes out / 54 GB/s + in / 53 "
        "GB/s), over their time (* where stock did not run in that run: the copy term "
        "alone, no measure of speed). Net interventions: out-of-memory errors the eviction "
        "net caught in the timed iterations (all iterations in brackets).",
    ]
    columns = ["loop", "scale", "batch", "mode", "result", "iterations", "units/s", "vs stock 1.0x",
               "% of bound", "net interventions", "out / in GB per iter", "peak GPU GiB",
               "peak host GiB (+ pluggable allocator's host pages)"]
    stock = _stock_of_each(records)
    units = {r["loop"]: r["unit"] for r in records if r.get("unit")}

    def row(r):
        ok = r.get("status") == "ok"
        ups = r.get("units_per_s")
        s1 = (stock.get(id(r)) or {}).get("units_per_s")
        status = str(r.get("status", "?"))
        err = "" if ok else ": " + str(r.get("error", ""))[:90]
        seen = r.get("step_s_seen") or []
        cut = records_.cut_by_timeout(r, "iterations")
        if cut:
            status, err = cut, _cut_run_figures(r, units.get(r["loop"], ""))
        elif status.startswith("killed"):
            # the harness's own kill: say when, not the child's last printed line
            err = (f" after {len(seen)} iterations" + (f" (the first took {seen[0]:.0f} s)"
                   if seen else "") + f", {r.get('min_mem_available', 0) / 2**30:.1f} GiB "
                   "of host memory left")
        return [
            r["loop"], f"{r['scale']}x", str(r["batch"]),
            r["mode"] + (f" ({', '.join(r['lms_options'])})" if r.get("lms_options") else ""),
            (status + err
             + (" (timeout hit while it exited, after its result)" if r.get("cut_after_result")
                else "")).replace("|", "/").replace("\n", " "),
            str(r.get("steps_done", "-")),
            f"{ups:.0f} {r.get('unit', '')}" if ok and ups else "-",
            f"{100 * ups / s1:.1f}%" if ok and ups and s1 else "-",
            (f"{100 * r['frac_of_bound']:.1f}%" + ("" if r.get("bound_has_compute") else "*"))
            if ok and r.get("frac_of_bound") and r["mode"] != "stock" else "-",
            f"{r['net_interventions']} ({r['net_interventions_all']})" if ok and r["mode"] == "lms" else "-",
            f"{r['out_gb_per_iter']:.1f} / {r['in_gb_per_iter']:.1f}" if ok and r["mode"] in SWAPPING else "-",
            f"{r['peak_alloc'] / GiB:.1f}" if r.get("peak_alloc") else "-",
            host_gib(r),
        ]

    def note(rows):
        return (f"{records_.gpu_label(rows[0]['machine'])}, torch {rows[0].get('torch')}. "
                "Commands: " + "; ".join(f"`{c}`" for c in dict.fromkeys(r["command"] for r in rows)))

    records_.write_by_commit(path, records, head, columns, lambda rows: [row(r) for r in rows], note)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--search", type=int, nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--fits", type=int, help=argparse.SUPPRESS)
    children.add_compile_option(ap)
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--loops", nargs="+", default=None, help="loops.py's loops (default: all)")
    ap.add_argument("--modes", nargs="+", default=["stock", "save_on_cpu", "torchtune", "lms"])
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--baseline-scales", type=float, nargs="+", default=[1.0],
                    help="scales at which the modes that do not swap run")
    ap.add_argument("--lms-scales", type=float, nargs="+", default=None,
                    help="the scales the swapping modes (lms, pluggable, pluggable+lms) run at "
                         "(default: all of --scales)")
    ap.add_argument("--base-batch", action="append", default=[], metavar="LOOP=N",
                    help="stock's largest batch for LOOP, found earlier (default: searched)")
    ap.add_argument("--allocator-settings", default="", metavar="SETTINGS",
                    help="the pluggable modes' allocator LMS settings, as "
                         "lms_swap.allocator.enable takes them (e.g. 'lms_defrag:True')")
    ap.add_argument("--lms-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an lms_swap tunable for the lms and pluggable+lms modes (repeatable; "
                         "as bench_lms_swap.py's), e.g. prefetch_depth=96; the table "
                         "shows it beside the mode")
    ap.add_argument("--lms-variant", action="append", default=[], metavar="KEY=VALUE,...",
                    help="run each lms and pluggable+lms configuration once per variant "
                         "(repeatable; comma-separated tunables added to --lms-option's, "
                         "'defaults' for none), against the same stock run: e.g. "
                         "--lms-variant defaults --lms-variant prefetch_past_peak=0")
    ap.add_argument("--steps", type=int, default=30, help="iterations per configuration")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations among them")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    ap.add_argument("--budget", type=float, default=560.0,
                    help="seconds for the whole run; a configuration starts only while what "
                         "is left covers the longest one finished so far")
    ap.add_argument("--host-guard-gib", type=float, default=6.0)
    device_cap.add_option(ap)
    ap.add_argument("--record", default=str(RECORD), help="JSON Lines file to append to")
    ap.add_argument("--table", default=str(TABLE), help="markdown table to rewrite")
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite the table from the records, run nothing")
    args = ap.parse_args()
    try:
        variants = lms_variants(args.lms_variant)
    except ValueError as e:
        ap.error(str(e))
    device_cap.pass_to_children(args.device_gib, args.device_hold)
    if args.child:
        if args.compile:
            return children.compile_child(args.compile)
        if args.fits:
            return child_fits(args)
        return child_search(args) if args.search else child(args)
    if args.table_only:
        records = [json.loads(x) for x in open(args.record) if x.strip()]
        write_table(pathlib.Path(args.table), records)
        return 0

    import loops
    install_stop_handlers()
    budget = Budget(args.budget, floor=30.0)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=ALLOC_CONF, PYTHONUNBUFFERED="1")
    record = pathlib.Path(args.record)
    record.parent.mkdir(parents=True, exist_ok=True)
    log = open(record.parent / "bench_loops.log", "a")
    cmd = "python " + " ".join([os.path.basename(__file__)] + sys.argv[1:])
    head = records_.header()  # run (LMS_RUN), date, commit, machine, torch: as the zoo's
    given = {k: int(v) for k, _, v in (b.partition("=") for b in args.base_batch)}
    guard = int(args.host_guard_gib * GiB)

    stock_rows = {}  # loop -> its stock row at 1.0x in this run, the bound's compute term

    def finish(row, r):
        """Completes one configuration's row from its child's result ``r``, appends it to
        the record and prints it (run as soon as the result is known: see run_process)."""
        if r is not None:
            r = finished_before_cut(r, "loop", row["loop"])
            row.update({k: v for k, v in r.items() if k not in row})
            budget.finished(row)
        if _is_stock_base(row):
            stock_rows[row["loop"]] = row
        add_bound(row, stock_rows.get(row["loop"]))
        figures = cut_figures(row, stock_rows.get(row["loop"]))
        if figures:
            row["cut_figures"] = figures
        # the iterations' counter lines go beside the record; a copy, so that this run's
        # stock row keeps its own for the bound of the rows after it
        records_.append_with_traces(record, dict(row), split=records_.split_row_traces)
        frac, mode = row.get("frac_of_bound"), row["mode"]
        print(f"{row['loop']:16s} x{row['scale']:<4} b={row['batch']:<5} {mode:11s} "
              f"{row.get('status')} iters {row.get('steps_done')} "
              + (f"{row['units_per_s']:.0f} {row.get('unit')} " if row.get("units_per_s") else "")
              + (f"{100 * frac:.1f}% of bound " if frac and mode != "stock" else "")
              + (f"net {row.get('net_interventions')}({row.get('net_interventions_all')}) "
                 f"out/in {row.get('out_gb_per_iter', 0):.1f}/{row.get('in_gb_per_iter', 0):.1f} GB"
                 if mode in SWAPPING and row.get("status") == "ok" else "")
              + (f" | {str(row.get('error', ''))[:200]}" if row.get("status") != "ok" else ""),
              flush=True)

    compiles = children.compile_first(
        compiled(args.modes), args.compile_s, budget.left,
        lambda w, t: run_process([sys.executable, __file__, "--child", children.COMPILE_FLAG, w],
                                 t, guard, log, env))
    head.update({f"{what}_compile": got for what, got in compiles.items()})
    for name in args.loops or loops.LOOPS:
        base = given.get(name)
        if not base:
            lo, hi = loops.SEARCH[name]
            r = run_process([sys.executable, __file__, "--child", "--loop", name,
                             "--search", str(lo), str(hi)], min(600, budget.left()), guard, log, env)
            base = r.get("max_batch")
            print(f"[{name}] stock's largest batch: {base}", flush=True)
            if not base:
                continue
        stock_rows.pop(name, None)
        for scale in args.scales:
            batch = max(1, int(round(base * scale)))
            for mode, variant in ((m, v) for m in args.modes
                                  for v in (variants if m in LAYERED else [[]])):
                if not runs_at(mode, scale, args.baseline_scales, args.lms_scales):
                    continue
                row = {"loop": name, "scale": scale, "batch": batch, "mode": mode,
                       "base_batch": base, **head, "command": cmd, "steps_asked": args.steps,
                       "warmup": args.warmup, "alloc_conf": ALLOC_CONF}
                if mode.startswith("pluggable") and args.allocator_settings:
                    row["allocator_settings"] = args.allocator_settings
                if mode in LAYERED and (args.lms_option or variant):
                    row["lms_options"] = list(args.lms_option) + variant
                refused = budget.refusal()
                if refused:
                    row["status"] = refused
                    finish(row, None)
                    continue
                # run_process hands the result to finish before a stop of the bench
                # (Stopped) ends it: a cut run is recorded as far as it ran
                limit = min(args.timeout, budget.left())

                def landed(r, row=row, limit=limit):
                    # the run's budget, not --timeout, limits it: a cut says so
                    mark_if_cut(row, r, limit, args.timeout)
                    finish(row, r)
                run_process([sys.executable, __file__, "--child", "--loop", name,
                             "--mode", mode, "--batch", str(batch),
                             "--steps", str(args.steps), "--warmup", str(args.warmup),
                             "--allocator-settings", args.allocator_settings]
                            + [x for opt in row.get("lms_options", ()) for x in ("--lms-option", opt)],
                            limit, guard, log, env,
                            on_result=landed)
    records = [json.loads(x) for x in open(record) if x.strip()]
    write_table(pathlib.Path(args.table), records)
    print(f"total wall {budget.elapsed():.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
