#!/usr/bin/env python3
"""Benchmark: activation swapping under DDP and FSDP2 on the GPUs of one node, one run.

Every configuration is one ``torchrun --nproc-per-node N ../ddp_lms.py ...`` job, in its
own session with a timeout and a host-memory guard (children.py): a crash, a CUDA OOM or
the OOM killer ends only that job.  In order, as long as the time budget lasts:

  probe      the pinned copy rates of every GPU while all copy at once (they share the
             host's memory and, on some machines, a PCIe switch)
  search     stock's largest per-rank batch (one process, the engine's wrapper, 4 steps
             a trial), unless --base-batch gives it
  then       stock and lms at 1.0x and lms at --scales of that batch, under DDP and FSDP on
             all GPUs, and the same model on one GPU for the N-GPU/1-GPU ratio

Reported per configuration and rank: step time, throughput (all ranks together), bytes
swapped out/in per step, the PCIe bound of FACTS.md per rank
    bound = max(compute, S_out / 54 GB/s + S_in / 53 GB/s)
with compute = stock's 1.0x step time of that engine and GPU count, scaled to the batch;
peak host RSS of each rank and of the node against the node's host budget (80% of RAM,
which lms_swap splits among the ranks of the node by default).

    python3 examples/pytorch/benchmarks/bench_distributed.py --model resnet50
    ... --max-gpu-gib 70      # cap each rank's device memory (shorter runs on big GPUs)
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from budget import Budget, mark_if_cut  # noqa: E402
from children import install_stop_handlers, meminfo, run_process  # noqa: E402
from link_rate import FACTS_RATES, GiB, pcie_step_s, pinned_rates  # noqa: E402
import records  # noqa: E402

RECORD = HERE / "records" / "distributed.jsonl"
TABLE = HERE / "RESULTS-distributed.md"

EXAMPLE = HERE.parent / "ddp_lms.py"
ALLOC_CONF = "expandable_segments:True"  # as bench_lms_swap.py: every mode alike


def probe() -> None:
    """Child of ``--probe``: pinned copy rates of this rank's GPU while every rank copies."""
    import torch
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rates = pinned_rates(4 * GiB, 3, barrier=dist.barrier)
    print("RESULT " + json.dumps({"rank": dist.get_rank(), **rates}), flush=True)
    dist.destroy_process_group()


def torchrun(nproc: int, argv) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"] + [str(a) for a in argv]


def plan(args, gpus: int) -> list:
    """(engine, nproc, scale, lms) in the order they run: what the comparison needs most
    first, so that a short budget still answers 'does it train on N GPUs'."""
    top = max(args.scales)
    order = [("ddp", gpus, 1.0, False), ("ddp", gpus, top, True), ("fsdp", gpus, top, True),
             ("ddp", gpus, 1.0, True), ("ddp", 1, 1.0, False), ("ddp", 1, top, True),
             ("fsdp", gpus, 1.0, False), ("fsdp", gpus, 1.0, True)]
    order += [("ddp", gpus, s, True) for s in args.scales if s not in (1.0, top)]
    order += [("fsdp", gpus, s, True) for s in args.scales if s not in (1.0, top)]
    order.append(("ddp", gpus, top, False))  # stock above its largest batch: expected OOM
    seen = set()  # on one GPU the N-GPU and 1-GPU entries are the same job
    return [c for c in order if c[0] in args.engines and not (c in seen or seen.add(c))]


def summarize(row: dict, stock: dict, rates) -> None:
    """Adds per-rank bound and node totals to ``row`` (in place)."""
    ranks = sorted((r for r in row.get("results", []) if "step_s" in r), key=lambda r: r["rank"])
    if not ranks:
        return
    row["step_s"] = max(r["step_s"] for r in ranks)  # the job runs at its slowest rank
    row["units_per_s"] = sum(r["units_per_s"] for r in ranks)
    row["unit"] = ranks[0]["unit"]
    row["node_peak_host_rss"] = sum(r.get("peak_host_rss") or 0 for r in ranks)
    if row.get("min_mem_available") is not None and row.get("host_total"):
        row["node_host_used_peak"] = row["host_total"] - row["min_mem_available"]
    base = stock.get((row["engine"], row["nproc"]))
    per_rank = []
    for r in ranks:
        out_b, in_b = r.get("out_bytes_per_step") or 0, r.get("in_bytes_per_step") or 0
        pcie = pcie_step_s(out_b, in_b, FACTS_RATES)
        compute = base["step_s"] * r["batch"] / base["batch"] if base else None
        bound = max(compute or 0.0, pcie)
        d = {"rank": r["rank"], "step_s": round(r["step_s"], 4), "out_gib": out_b / GiB,
             "in_gib": in_b / GiB, "bound_s": round(bound, 4),
             "pct_of_bound": round(100 * bound / r["step_s"], 1) if r.get("lms") and pcie else None,
             "peak_host_rss": r.get("peak_host_rss"), "host_limit": r.get("host.limit_bytes"),
             "guard_evicted": r.get("guard.evicted_bytes"), "host_full_kept": r.get("swap.host_full_kept")}
        if rates and r["rank"] in rates and pcie:
            pr = rates[r["rank"]]
            mbound = max(compute or 0.0, pcie_step_s(out_b, in_b, pr))
            d["pct_of_probed_bound"] = round(100 * mbound / r["step_s"], 1)
        per_rank.append(d)
    row["per_rank"] = per_rank


def fmt_row(row: dict, one_gpu: dict) -> str:
    """One line of results.md: the job, then its measurements ("-" where it did not finish)."""
    def g(b):
        return f"{b / GiB:.1f}" if b else "-"

    def per_rank(fmt, key):
        return ", ".join(fmt(d) for d in row.get("per_rank") or [] if d.get(key)) or "-"

    status = row["status"] if row["status"] == "ok" else f"**{row['status']}**"
    if row["status"] != "ok" and row.get("error"):
        status += ": " + " ".join(str(row["error"]).split())[:120]
    cells = [row["engine"], row["nproc"], f"{row['scale']}x", row["batch"],
             "lms" if row["lms"] else "stock", status]
    if row.get("step_s"):
        ref = one_gpu.get((row["scale"], row["lms"]))
        cells += [row.get("steps_done_all", "-"), f"{row['step_s']:.3f}",
                  f"{row['units_per_s']:.1f} {row['unit']}",
                  f"{row['units_per_s'] / ref:.2f}x" if ref and row["nproc"] > 1 else "-",
                  per_rank(lambda d: f"{d['out_gib']:.1f}/{d['in_gib']:.1f}", "out_gib"),
                  per_rank(lambda d: f"{d['pct_of_bound']}%", "pct_of_bound"),
                  per_rank(lambda d: f"{d['pct_of_probed_bound']}%", "pct_of_probed_bound"),
                  per_rank(lambda d: g(d["peak_host_rss"]), "peak_host_rss"),
                  g(row.get("node_peak_host_rss")), g(row.get("node_host_used_peak"))]
    else:
        cells += ["-"] * 10
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(meta: dict, rows: list) -> list:
    """The lines of one run's table: its setting, then a line per job."""
    one_gpu = {(r["scale"], r["lms"]): r["units_per_s"] for r in rows
               if r["nproc"] == 1 and r.get("units_per_s")}
    lines = [f"Command: `{meta['command']}`", "",
             f"Model {meta['model']}, per-rank largest stock batch {meta['base_batch']} "
             f"({meta['base_batch_from']}); device cap {meta['max_gpu_gib'] or 'none'} GiB a rank; "
             f"node host budget {meta['node_budget'] / GiB:.1f} GiB (80% of {meta['host_total'] / GiB:.1f}); "
             f"pinned copy rates with all GPUs copying: {meta.get('probe') or 'not measured'}.", "",
             "Step time is the slowest rank's mean over the timed steps; throughput is all ranks "
             "together; the bound per rank is max(compute, S_out/54 GB/s + S_in/53 GB/s) "
             "(FACTS.md), the probed bound uses the rates measured above. RAM in use at its "
             "peak: MemTotal less the lowest MemAvailable seen while the job ran (every process "
             "of the machine).", "",
             "| engine | GPUs | scale | batch/rank | mode | result | steps | step s | throughput | "
             "vs 1 GPU | out/in GiB per step (per rank) | % of bound (per rank) | % of probed bound | "
             "peak host RSS GiB (per rank) | node: sum of rank peaks GiB | node: RAM in use at its peak GiB |",
             "|" + "---|" * 16]
    return lines + [fmt_row(r, one_gpu) for r in rows]


def write(out: pathlib.Path, meta: dict, rows: list) -> None:
    (out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    lines = ["# LMS activation swapping under DDP / FSDP2: benchmark results", ""] + table(meta, rows)
    (out / "results.md").write_text("\n".join(lines) + "\n")


def write_table(path, recs) -> None:
    """RESULTS-distributed.md: every record, the newest first, a section each."""
    lines = ["# LMS activation swapping under DDP / FSDP2", "",
             "Written by bench_distributed.py from `records/distributed.jsonl` (one JSON line per "
             "run: run, date, commit, machine, torch, command, configuration, every job's "
             "counters; runs before the records: `source` names the folder they came from, and "
             "`records/runs.jsonl` holds that folder's notes)."]
    for r in reversed(recs):
        lines += ["", "## " + records.title(r), ""] + table(r, r.get("rows", []))
    pathlib.Path(path).write_text("\n".join(lines) + "\n")




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50", help="a model of zoo.py")
    ap.add_argument("--gpus", type=int, help="processes (GPUs) per job (default: all visible)")
    ap.add_argument("--engines", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    ap.add_argument("--scales", type=float, nargs="+", default=[1.5])
    ap.add_argument("--base-batch", type=int, help="stock's largest per-rank batch (skips the search)")
    ap.add_argument("--search", type=int, nargs=2, metavar=("LO", "HI"),
                    help="batch range of the search (default: zoo.py's)")
    ap.add_argument("--max-gpu-gib", type=float, help="cap each rank's device memory")
    ap.add_argument("--steps", type=int, default=20, help="steps of a swapping configuration")
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--baseline-steps", type=int, default=10, help="steps at 1.0x")
    ap.add_argument("--timeout", type=float, default=240, help="seconds for one job")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds for the whole run, the probe and the search included; a job "
                         "starts only while what is left covers the longest one finished so far")
    ap.add_argument("--host-guard-gib", type=float, default=8.0)
    ap.add_argument("--out", default=str(pathlib.Path(tempfile.gettempdir()) / "bench_distributed"),
                    help="folder of this run's raw log, results.json and results.md")
    ap.add_argument("--record", default=str(RECORD), help="JSON Lines file to append to")
    ap.add_argument("--table", default=str(TABLE), help="markdown table to rewrite")
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite the table from the records, run nothing")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.table_only:
        write_table(args.table, records.load(args.record))
        return 0
    if args.probe:
        probe()
        return 0

    install_stop_handlers()
    import torch
    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 1:
        raise SystemExit("bench_distributed.py needs CUDA GPUs")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "bench_log.txt", "a", buffering=1)  # line by line: kept if the run is cut
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=ALLOC_CONF)
    guard = int(args.host_guard_gib * GiB)
    budget = Budget(args.budget, floor=30.0)
    total = meminfo("MemTotal")
    common = ["--model", args.model] + (["--max-gpu-gib", args.max_gpu_gib] if args.max_gpu_gib else [])
    meta = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv), "model": args.model,
            "gpus": gpus, "max_gpu_gib": args.max_gpu_gib, "host_total": total,
            "node_budget": int(total * 0.80)}

    r = run_process(torchrun(gpus, [__file__, "--probe"]), 120, guard, log, env)
    rates = {x["rank"]: x for x in r.get("results", [])}
    meta["probe"] = "; ".join((f"rank {k}: d2h {v['d2h_gbps']} GB/s, h2d {v['h2d_gbps']} GB/s, "
                               f"both ways at once {v.get('both_ways_gbps_each')} GB/s each")
                              for k, v in sorted(rates.items())) or r.get("status")
    print(f"probe: {meta['probe']}", flush=True)

    if args.base_batch:
        base, meta["base_batch_from"] = args.base_batch, "given"
    else:
        import zoo
        lo, hi = args.search or zoo.SEARCH[args.model]
        r = run_process(torchrun(1, [EXAMPLE, "--search", lo, hi, "--engine", "ddp"] + common),
                        args.timeout * 2, guard, log, env)
        base = r.get("max_batch")
        meta["base_batch_from"] = f"searched in [{lo}, {hi}) under DDP on one GPU, {r['wall_s']} s"
        if not base:
            raise SystemExit(f"search found no batch: {r.get('status')} {r.get('error', '')}")
    meta["base_batch"] = base
    print(f"per-rank largest stock batch: {base} ({meta['base_batch_from']})", flush=True)

    rows, stock = [], {}
    for engine, nproc, scale, lms in plan(args, gpus):
        batch = int(round(base * scale))
        row = {"engine": engine, "nproc": nproc, "scale": scale, "batch": batch, "lms": lms,
               "host_total": meta["host_total"]}
        refused = budget.refusal()
        if refused:
            row["status"] = refused
        else:
            steps, warm = ((args.baseline_steps, 3) if scale == 1.0 else (args.steps, args.warmup))
            if not lms and scale > 1.0:
                steps, warm = 3, 1
            argv = [EXAMPLE, "--batch", batch, "--engine", engine, "--steps", steps,
                    "--warmup", warm] + common + ([] if lms else ["--no-lms"])
            # the budget bounds the whole run, the last job included
            timeout = min(args.timeout, budget.left())
            r = run_process(torchrun(nproc, argv), timeout, guard, log, env)
            mark_if_cut(row, r, timeout, args.timeout)  # a cut says the budget made it
            ranks = r.get("results", [])
            bad = [x for x in ranks if x.get("status") != "ok"]
            row["status"] = bad[0]["status"] if bad else r.get("status", "ok")
            if bad:
                row["error"] = bad[0].get("error")
            elif row["status"] != "ok" or len(ranks) < nproc:
                row["status"] = r.get("status") if r.get("status") != "ok" else f"exit {r['returncode']}"
                row["error"] = r.get("error")
            row["results"] = ranks
            row["wall_s"] = r["wall_s"]
            row["min_mem_available"] = r.get("min_mem_available")
            row["steps_done_all"] = min((x.get("steps", x.get("steps_done", 0)) for x in ranks), default=0)
            budget.finished({"status": row["status"], "wall_s": r["wall_s"]})
            if row["status"] == "ok" and not lms and scale == 1.0:
                stock[(engine, nproc)] = {"step_s": max(x["step_s"] for x in ranks), "batch": batch}
            summarize(row, stock, rates if nproc == gpus else {k: v for k, v in rates.items() if k == 0})
        rows.append(row)
        pr = row.get("per_rank") or []
        print(f"{engine} x{nproc} {scale}x b={batch} {'lms' if lms else 'stock'}: {row['status']} "
              f"step {row.get('step_s', 0):.3f}s "
              f"{' '.join(str(d.get('pct_of_bound')) + '%' for d in pr if d.get('pct_of_bound'))} "
              f"wall {row.get('wall_s', 0)}s", flush=True)
        write(out, meta, rows)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "record", "table", "table_only", "probe")}
    records.append(args.record, {**records.header(), **meta, "config": config, "rows": rows})
    write_table(args.table, records.load(args.record))
    print(f"total wall {budget.elapsed():.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
