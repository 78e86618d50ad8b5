"""The zoo benchmark's report (bench_lms_swap.py): each swapping row's bound, the line a
configuration prints, one run's results.md and RESULTS-zoo.md from every record."""
from __future__ import annotations

import pathlib

import records
from allocator_memory import host_gib
from link_rate import FACTS_RATES, GiB, pcie_step_s

__all__ = ["add_bounds", "summary_line", "table_rows", "write_markdown", "write_table"]


def fmt_gib(b):
    return "-" if b is None else f"{b / GiB:.1f}"


def add_bounds(row, stock_rate, link):
    """The bound of an lms row (in place): max(compute, copy term) where stock's 1.0x rate
    is known, else the copy term alone (``bound_has_compute`` says which); at FACTS.md's
    rates, and at this host's measured ones (``link``) where measured."""
    out_b, in_b = row["out_bytes_per_step"], row["in_bytes_per_step"]
    comp = row["units_per_s"] * row["step_s"] / stock_rate if stock_rate else 0.0
    row["bound_has_compute"] = bool(stock_rate)
    if stock_rate:
        row["compute_step_s"] = comp  # units per step / stock's rate
    row["pcie_step_s"] = pcie_step_s(out_b, in_b, FACTS_RATES)
    row["bound_step_s"] = max(comp, row["pcie_step_s"])
    if row["bound_step_s"] > 0:
        row["frac_of_bound"] = row["bound_step_s"] / row["step_s"]
    if link:
        row["probed_bound_step_s"] = max(comp, pcie_step_s(out_b, in_b, link))
        if row["probed_bound_step_s"] > 0:
            row["frac_of_probed_bound"] = row["probed_bound_step_s"] / row["step_s"]


def summary_line(r):
    s = f"{r['model']:8s} x{r['scale']:<4} b={r['batch']:<5} {r['mode']:11s} {r.get('status')}"
    if r.get("status") == "ok":
        s += f" {r['units_per_s']:.1f} {r['unit']} step {r['step_s']:.3f}s peakGPU {fmt_gib(r['peak_alloc'])}G host {host_gib(r)}G"
        if "out_bytes_per_step" in r:
            s += f" out/in {fmt_gib(r['out_bytes_per_step'])}/{fmt_gib(r['in_bytes_per_step'])}G"
        if "frac_of_bound" in r:
            s += f" {100 * r['frac_of_bound']:.1f}% of bound"
            if not r.get("bound_has_compute"):
                s += " (copy term)"
        if "frac_of_probed_bound" in r:
            s += f" ({100 * r['frac_of_probed_bound']:.1f}% at this host's rates)"
        if r.get("alloc_retries"):
            s += f" alloc retries {r['alloc_retries']}"
    elif r.get("error"):
        s += " | " + r["error"].strip().replace("\n", " ")[:160]
    return s


TABLE_HEAD = [
    "| model | scale | batch | mode | result | throughput | vs stock 1.0x | step s | timed steps (allocator retries) | peak GPU alloc / reserved GiB | peak host RSS GiB (+ pluggable allocator's host pages) | out / in GiB per step | PCIe bound step s | % of bound | % of probed bound |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def table_rows(results):
    """The table's lines of one run's configurations."""
    rows = []
    stock = {}
    for r in results:
        if r["mode"] == "stock" and r["scale"] == 1.0 and r.get("status") == "ok":
            stock[r["model"]] = r["units_per_s"]
    for r in results:
        ok = r.get("status") == "ok"
        thr = f"{r['units_per_s']:.1f} {r['unit']}" if ok else "-"
        rel = f"{100 * r['units_per_s'] / stock[r['model']]:.1f}%" if ok and r["model"] in stock else "-"
        status = r.get("status", "?")
        if not ok and r.get("steps_done") is not None:
            status = records.cut_by_timeout(r, "steps") or status + records.how_far(r, "steps")
        elif not ok and r.get("error"):
            status += ": " + r["error"].strip().splitlines()[-1][:80].replace("|", "/")
        if r.get("cut_after_result"):
            status += " (timeout hit while it exited, after its result)"
        rows.append("| " + " | ".join([
            r["model"], f"{r['scale']}x", str(r["batch"]), r["mode"], status, thr, rel,
            f"{r['step_s']:.3f}" if ok else "-",
            f"{r['timed_steps']} ({r['timed_alloc_retries']})" if "timed_steps" in r else "-",
            f"{fmt_gib(r.get('peak_alloc'))} / {fmt_gib(r.get('peak_reserved'))}" if "peak_alloc" in r else "-",
            host_gib(r),
            f"{fmt_gib(r['out_bytes_per_step'])} / {fmt_gib(r['in_bytes_per_step'])}" if "out_bytes_per_step" in r else "-",
            f"{r['bound_step_s']:.3f}" if "bound_step_s" in r else "-",
            (f"{100 * r['frac_of_bound']:.1f}%" + ("" if r.get("bound_has_compute") else "*"))
            if "frac_of_bound" in r else "-",
            f"{100 * r['frac_of_probed_bound']:.1f}%" if "frac_of_probed_bound" in r else "-",
        ]) + " |")
    return rows


def write_table(path, recs):
    """RESULTS-zoo.md: every record, the newest first, a section each."""
    lines = [
        "# LMS activation swapping on the model zoo: stock vs save_on_cpu vs LMS", "",
        "Written by bench_lms_swap.py from `records/zoo.jsonl` (one JSON line per run: run, "
        "date, commit, machine, torch, command, configuration, every configuration's counters; "
        "runs before the records: `source` names the folder they came from, and "
        "`records/runs.jsonl` holds that folder's notes).", "",
        "Bound = max(compute, S_out/54 GB/s + S_in/53 GB/s) with compute = stock step time at "
        "1.0x scaled to the batch (where stock ran at 1.0x in the same run; else the copy term "
        "alone, marked *); S = bytes lms moved per step; probed: at the pinned copy rates "
        "measured on the host at the start of the run.",
    ]
    for r in reversed(recs):
        link = r.get("link")
        lines += ["", "## " + records.title(r), "", f"Command: `{r.get('command')}`"
                  + (f" Pinned copies: {link.get('d2h_gbps')} GB/s out, {link.get('h2d_gbps')} in."
                     if link else ""), ""] + ([r["note"], ""] if r.get("note") else [])
        lines += TABLE_HEAD + table_rows(r.get("results", []))
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def write_markdown(path, cmd, results, args, link=None):
    lines = [
        "# LMS activation swapping: benchmark results", "",
        f"Command: `{cmd}`", "",
        f"bf16 autocast, {args.optimizer}, the models of zoo.py as their libraries build them "
        f"(gpt2: 12 layers, d=768, 12 heads, seq {args.seq_len}, fp32 loss over "
        f"{args.loss_chunk or args.seq_len} tokens at a time). "
        f"PYTORCH_CUDA_ALLOC_CONF={args.alloc_conf or '(default)'} for every mode. "
        f"{args.warmup} warm-up steps, then {args.steps} timed steps (synchronized)"
        + (f" or more, until {args.min_seconds:g} s have passed. " if args.min_seconds else ". ") +
        "Bound = max(compute, S_out/54 GB/s + S_in/53 GB/s) with compute = stock step time "
        "at 1.0x scaled to the batch (where stock ran at 1.0x in this run; else the copy term "
        "alone, marked *); S = bytes lms moved per step. This host's pinned copies: "
        + (f"{link['d2h_gbps']} GB/s out, {link['h2d_gbps']} in, {link['both_ways_gbps_each']} "
           f"each way at once; the probed bound uses the first two." if link else "not measured."),
        "",
    ] + TABLE_HEAD
    lines += table_rows(results)
    path.write_text("\n".join(lines) + "\n")
