#!/usr/bin/env python3
"""The tables of the records that no benchmark harness rewrites: the allocator suites
(``records/allocator.jsonl``, ``records/tf_allocator.jsonl``), the victim-policy replays
(``records/victim_trace.jsonl``) and the one-off probes (``records/probes.jsonl``).  Each
``RESULTS-<name>.md`` is written from its records by records.write_by_commit, a section per
commit; nobody copies figures by hand.

    python examples/pytorch/benchmarks/record_tables.py --table-only            # all four
    python examples/pytorch/benchmarks/record_tables.py --table-only allocator probes
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import records  # noqa: E402
from records import cell  # noqa: E402

GiB = 1 << 30
REGENERATE = "python examples/pytorch/benchmarks/record_tables.py --table-only {name}"


def _gib(b) -> str:
    return "-" if b is None else f"{b / GiB:.1f}"


def _num(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def command_of(r: dict):
    """The command a record names: its own ``command``, else its data's."""
    data = r.get("data")
    return r.get("command") or (data.get("command") if isinstance(data, dict) else None)


def note(group: list) -> str:
    """A section's first line: machine, torch, its runs, the commands that produced them
    (from the records; where a record has none, its folder's notes in runs.jsonl do)."""
    gpu = records.gpu_label(group[0].get("machine"))
    torch = group[0].get("torch")
    runs = ", ".join(dict.fromkeys(
        f"{r.get('run')}" + (f" (`{r['source']}`)" if r.get("source") else "") for r in group))
    cmds = list(dict.fromkeys(c for c in map(command_of, group) if c))
    folders = list(dict.fromkeys(str(r.get("source") or "?").split("/")[0] for r in group
                                 if not command_of(r)))
    s = f"{gpu}, torch {torch or 'not recorded'}. Runs: {runs}."
    if cmds:
        s += " Commands: " + "; ".join(f"`{c}`" for c in cmds) + "."
    if folders:
        s += (" Commands not in the records: the notes of " + ", ".join(f"`{f}`" for f in folders)
              + " in `records/runs.jsonl` name them.")
    return s


def head(name: str, title: str, what: str, columns: list) -> list:
    return [f"# {title}", "",
            f"Written by record_tables.py from `records/{name}.jsonl` ({what}); regenerate with "
            f"`{REGENERATE.format(name=name)}`. A section per commit, the newest first; each "
            "names the runs, their folders and the commands that produced them.", "",
            "Columns:"] + [f"- **{c}**: {m}" for c, m in columns]


# ----------------------------------------------------------------------------- allocator
def _errors(t: dict) -> str:
    """Data errors a scenario counted: its mismatches* and bad_* counters, summed."""
    rounds = t.get("rounds") if isinstance(t.get("rounds"), list) else []
    parts = [t] + [x for x in rounds if isinstance(x, dict)]
    n = [v for d in parts for k, v in d.items() if (k.startswith("mismatches") or k.startswith("bad_"))
         and isinstance(v, int) and not isinstance(v, bool)]
    return str(sum(n)) if n else "-"


def _outcome(t: dict) -> str:
    bits = []
    if t.get("ok") is True:
        bits.append("served")
    if t.get("oom") is True:
        bits.append("OOM")
    elif t.get("oom") is False and "ok" not in t:
        bits.append("no OOM")
    if "failure" in t:
        bits.append("net failed" if t["failure"] else "no failure")
    if "retry_served" in t:
        bits.append("retry served" if t["retry_served"] else "retry refused")
    if "child_status" in t:
        bits.append(f"child exit status {t['child_status']}")
    return ", ".join(bits) or "ran"


def _rounds(t: dict) -> str:
    d2h, h2d = t.get("ref_d2h_gbps"), t.get("ref_h2d_gbps")
    rs = t.get("rounds") or []
    out = "/".join(f"{x['out_gbps'] / d2h:.2f}" for x in rs if d2h and x.get("out_gbps"))
    back = "/".join(f"{x['in_gbps'] / h2d:.2f}" for x in rs if h2d and x.get("in_gbps"))
    s = f"spill {out}, return {back} of pinned ({_num(d2h, '{:.1f}')} / {_num(h2d, '{:.1f}')} GB/s)"
    if t.get("page_bytes"):
        s += f", {t['page_bytes'] >> 20} MiB pages"
    return s


def _figures(name: str, t: dict) -> str:
    if name.startswith("bandwidth"):
        return _rounds(t)
    if name.startswith("launchcost"):
        return (f"{t['us_per_launch']:.2f} us a launch"
                + (f" ({t['us_per_launch_cpp']:.2f} from C++)" if t.get("us_per_launch_cpp") else ""))
    if name.startswith("oversubscribe"):
        return f"allocated {_gib(t.get('allocated'))} of {_gib(t.get('target'))} GiB asked"
    if name.startswith("net_"):
        return (f"{t.get('n_blocks')} of {t.get('blocks_target')} blocks; {t.get('slots_evicted')} "
                f"slots evicted; first allocator spill at block {t.get('first_allocator_spill')}, "
                f"first net catch at {t.get('first_net_catch')}")
    if name.startswith("defrag"):
        return f"{_gib(t.get('request'))} GiB asked over {t.get('n_segments')} segments"
    if name.startswith("hostlimit"):
        return f"{t.get('n_ok')} allocations served, then the limit"
    if name.startswith("foreign"):
        return (f"{t.get('rounds')} rounds, {_gib(t.get('swapped_out'))} GiB out / "
                f"{_gib(t.get('swapped_in'))} in")
    if name.startswith("fork_exit"):
        return f"child exited in {t.get('child_exit_s')} s, {_gib(t.get('idle_at_fork'))} GiB idle at fork"
    if name.startswith("late_enable"):
        return (f"spill {_num(t.get('out_gbps'), '{:.1f}')} GB/s of {_gib(t.get('out_bytes'))} GiB, "
                f"{_gib(t.get('made_on_demand'))} GiB of host pages made on demand")
    if name.startswith("remap_failure"):
        return f"{t.get('pages_in')} pages back"
    if name.startswith("stats"):
        return f"{t.get('n_allocs')} allocations"
    if name.startswith("sequence"):
        return f"{len(t.get('trace') or [])} trace events"
    return "-"


ALLOCATOR_COLUMNS = [
    ("run", "the run's id (and the part of it, where a run had several)"),
    ("scenario", "the test scenario of `tests/conformance/pytorch_allocator` whose JSON this is "
                 "(`_lms`: LMS on; `_pristine`: upstream's allocator; the suffix: its parameter)"),
    ("outcome", "what the scenario's request got: served, OOM, the eviction net's failure, the "
                "retry after a failed remap, a forked child's exit status; `ran` where it "
                "records none of these"),
    ("data errors", "the scenario's mismatches* and bad_* counters (its rounds' too) summed: "
                    "bytes that came back wrong (`-`: it counts none)"),
    ("figures", "its measured quantities: spill and return as fractions of the pinned copy the "
                "same process measured (per round: first/second/third), microseconds a kernel "
                "launch, GiB allocated, the net's blocks and evictions, ..."),
    ("wall s", "the scenario's wall time"),
]


def allocator_rows(group: list) -> list:
    rows = []
    for r in group:
        run = str(r.get("run")) + (f" ({r['part']})" if r.get("part") else "")
        for name, t in (r.get("tests") or {}).items():
            if name == "summary" or not isinstance(t, dict):
                continue
            rows.append([cell(run), cell(name), cell(_outcome(t)), _errors(t),
                         cell(_figures(name, t)), _num(t.get("wall_s"), "{:.1f}")])
        py = r.get("pytest")
        if isinstance(py, dict) and py.get("line"):  # the whole suite's verdict, where kept
            why = f"deselected: {', '.join(py.get('deselected') or [])} ({py['deselected_why']})" \
                if py.get("deselected_why") else "-"
            rows.append([cell(run), "pytest", cell(py["line"]), "-", cell(why), "-"])
    return rows


# ----------------------------------------------------------------------------- TensorFlow
_BW = re.compile(r"bandwidth(?: \(([^)]*)\))? round (\d+)[^:]*?(?:, (\d+) MiB pages)?: spill ([\d.]+) GB/s, "
                 r"return ([\d.]+) GB/s; of pinned: spill ([\d.]+), return ([\d.]+)")
_RESULT = re.compile(r"\[  (PASSED|FAILED)  \].*|\d+ (?:passed|failed)[^=]*|\brc=\d+|Check failed")

TF_COLUMNS = [
    ("run", "the run's id"),
    ("log", "the log the record keeps (the lines that carry results)"),
    ("result", "gtest's PASSED/FAILED lines, pytest's summary, the exit status (`rc=`), or a "
               "failed CHECK, as the log has them"),
    ("OK tests", "gtest `[       OK ]` lines in the log"),
    ("spill / return, of pinned", "per `bandwidth` round of `LmsBfc` (`LMS_TEST_DEVICE_MB` "
                                  "sets its size): spill and return as fractions of the pinned "
                                  "copy measured in the same process; host pages made ahead or "
                                  "on the way, and the page size, where the log says"),
]


def tf_rows(group: list) -> list:
    rows = []
    for r in group:
        for log, lines in (r.get("logs") or {}).items():
            res = list(dict.fromkeys(m.group(0).strip() for x in lines for m in [_RESULT.search(x)] if m))
            bw = []
            for x in lines:
                m = _BW.search(x)
                if m:
                    how = f"{m.group(1)}, " if m.group(1) else ""
                    page = f"{m.group(3)} MiB, " if m.group(3) else ""
                    bw.append(f"{how}{page}round {m.group(2)}: {float(m.group(6)):.2f} / {float(m.group(7)):.2f}")
            rows.append([cell(r.get("run")), cell(log), cell("; ".join(res)),
                         str(sum("[       OK ]" in x for x in lines)), cell("; ".join(bw))])
        py = r.get("pytest")
        if not r.get("logs") and isinstance(py, dict) and py.get("line"):  # --suite-record's
            failed = f"; failed: {', '.join(py['failed'])}" if py.get("failed") else ""
            rows.append([cell(r.get("run")), "pytest", cell(py["line"] + failed), "-", "-"])
    return rows


# ----------------------------------------------------------------------------- victims
VICTIM_COLUMNS = [
    ("run", "the run that recorded the trace (replayed on the CPU by `victim_trace.py simulate`)"),
    ("model", "the zoo model traced, and its batch"),
    ("capacity", "the device capacity of the replay: its fraction of the step's peak of live "
                 "bytes, and GiB"),
    ("policy", "which blocks the replay moves out when the device is full"),
    ("out / in GB", "bytes moved out and back in over the step"),
    ("moves", "blocks moved"),
    ("ops over capacity", "ops whose own blocks did not fit the capacity"),
    ("PCIe s", "the moves' time at FACTS.md's pinned copy rates"),
    ("vs alloc-order", "bytes moved over those of the alloc-order policy at the same capacity"),
]


def victim_rows(group: list) -> list:
    rows = []
    for r in group:
        meta = r.get("meta") or {}
        for x in r.get("rows") or []:
            rows.append([cell(r.get("run")), cell(f"{r.get('model')}, batch {meta.get('batch')}"),
                         f"{x.get('fraction')} ({_gib(x.get('capacity'))} GiB)", cell(x.get("policy")),
                         f"{x['bytes_out'] / 1e9:.2f} / {x['bytes_in'] / 1e9:.2f}",
                         cell(x.get("moves")), cell(x.get("ops_over_capacity")),
                         _num(x.get("pcie_s"), "{:.3f}"), _num(x.get("moved_vs_alloc_order"), "{:.2f}")])
    return rows


# ----------------------------------------------------------------------------- probes
PROBE_COLUMNS = [
    ("run", "the run's id"),
    ("probe", "the file the run wrote (`probe`)"),
    ("kind", "what wrote it: `bench_lms_swap.py` (one configuration of the zoo benchmark), "
             "`net_cost.py`, `vmm_costs.cu`, `region_costs.cu`, `profile_step.py`, "
             "`backward_memory.py`"),
    ("figures", "bench_lms_swap: model, scale, batch, result, seconds a step, % of the bound, "
                "GiB out/in a step; net_cost: per round, GB moved and GB/s of eviction, fetch "
                "and populate; vmm_costs: pinned copy GB/s, host handle creation GB/s by "
                "threads, each spill variant's GB/s; region_costs: per round, seconds of each "
                "piece of growing a pool by one region; profile_step: seconds a timed step and "
                "its phases on the GPU, the profiled step's compute stream busy and idle, its "
                "copies each way, and the CPU's longest block; backward_memory: per backward, "
                "forward's end and the peaks of its first, highest and last intervals, and per step the "
                "allocation as backward reached the first, highest and last layer, in GB"),
]


def _profile(p: dict) -> str:
    """profile_step.py's figures, as one cell."""
    timed = p.get("timed") or []
    s = f"{p.get('what')} batch {p.get('batch')} {p.get('mode')}"
    if p.get("lms_options"):
        s += " (" + ", ".join(p["lms_options"]) + ")"
    if timed:
        steps = [t["step_s"] for t in timed]
        s += f": {min(steps):.3f}-{max(steps):.3f} s a step"
        phases = timed[-1].get("gpu_s") or {}
        s += " (" + ", ".join(f"{n} {v:.3f}" for n, v in phases.items()) + " on the GPU)"
    prof = p.get("profiled_step") or {}
    c = prof.get("compute")
    if c:
        s += (f"; profiled: compute busy {c['busy_ms']} of {c['span_ms']} ms, "
              f"{c['gaps']} gaps of {c['gaps_ms']} ms")
    for side in prof.get("side_streams") or []:
        s += f"; copies {side['gb']} GB at {side['gb_s']} GB/s ({side['from_ms']}-{side['to_ms']} ms)"
    blocks = prof.get("blocking") or {}
    if blocks:
        name, b = max(blocks.items(), key=lambda kv: kv[1]["ms"])
        s += f"; longest CPU block: {b['count']}x {name}, {b['ms']} ms"
    return s


def _backward_memory(p: dict) -> str:
    """backward_memory.py's figures, as one cell: each backward's forward end and peaks,
    the allocation as backward reached the first, highest and last watched layer, and
    (``--live-step``) the largest groups of what was live at the layer it names."""
    s = f"{p.get('what')} batch {p.get('batch')} {p.get('mode', 'lms')}"
    if p.get("lms_options"):
        s += " (" + ", ".join(p["lms_options"]) + ")"
    out = []
    for st in p.get("steps") or []:
        levels = [x[1] for x in st.get("layers") or []]
        if levels:
            out.append(f"step {st['i']} layers {levels[0]}-{max(levels)}-{levels[-1]} GB")
    for b in p.get("backwards") or []:
        if not b.get("intervals"):
            out.append(f"step {b.get('step')}: no intervals")
            continue
        h = b["highest"]
        where = "first" if h["offset_gb"] is None else f"at {h['offset_gb']} GB"
        out.append(f"step {b.get('step')}: end {b['forward_end_gb']}, first {b['first_peak_gb']}, "
                   f"highest {h['peak_gb']} ({where}), last {b['last']['peak_gb']} GB")
    live = p.get("live")
    if live:
        # the three largest groups of what was allocated as backward reached the layer
        top = ", ".join(f"{g['gb']} {g['when']} {g['site']}" for g in live["groups"][:3])
        out.append(f"live at step {p.get('live_step')}'s {p.get('live_layer')}: "
                   f"{live['live_gb']} GB ({live['from_forward_gb']} from forward's end; {top})")
    return s + ": " + "; ".join(out) if out else s


def _probe(data: dict):
    if "profile" in data:
        return "profile_step.py", _profile(data["profile"])
    if "backward_memory" in data:
        return "backward_memory.py", _backward_memory(data["backward_memory"])
    if "unreadable" in data:
        return "?", f"not kept: the file did not parse ({data['unreadable']})"
    if "results" in data:
        out = []
        for x in data["results"]:
            s = f"{x.get('model')} {x.get('scale')}x batch {x.get('batch')} {x.get('mode')}: {x.get('status')}"
            if x.get("status") == "ok":
                s += f", {_num(x.get('step_s'), '{:.3f}')} s a step"
                if x.get("frac_of_bound"):
                    s += f", {100 * x['frac_of_bound']:.1f}% of bound" + ("" if x.get("bound_has_compute") else "*")
                if "out_bytes_per_step" in x:
                    s += f", {_gib(x['out_bytes_per_step'])} / {_gib(x['in_bytes_per_step'])} GiB a step"
            out.append(s)
        return "bench_lms_swap.py", "; ".join(out)
    if "rows" in data:
        return "net_cost.py", "; ".join(
            f"round {x.get('round')}: {x.get('gb')} GB, evict {x.get('evict_gb_s')} GB/s, fetch "
            f"{x.get('fetch_gb_s')}, populate {x.get('populate_gb_s')}" for x in data["rows"])
    if "spill" in data:
        spill = ", ".join(f"{k} {v.get('gbps')}" for k, v in data["spill"].items() if isinstance(v, dict))
        create = ", ".join(f"{k}: {v}" for k, v in (data.get("host_create_gbps") or {}).items())
        return "vmm_costs.cu", (f"{data.get('total_gib')} GiB of {data.get('page_mib')} MiB pages; pinned "
                                f"{data.get('pinned_d2h_gbps')} / {data.get('pinned_h2d_gbps')} GB/s; host "
                                f"handles by threads {create} GB/s; spill GB/s: {spill}")
    if "rounds" in data:
        return "region_costs.cu", f"{data.get('total_gib')} GiB of {data.get('page_mib')} MiB pages; " + "; ".join(
            f"round {i}: " + ", ".join(f"{k} {v}" for k, v in x.items()) for i, x in enumerate(data["rounds"]))
    return "?", "-"


def probe_rows(group: list) -> list:
    rows = []
    for r in group:
        kind, figures = _probe(r.get("data") or {})
        rows.append([cell(r.get("run")), cell(r.get("probe")), kind, cell(figures)])
    return rows


# ----------------------------------------------------------------------------- the tables
TABLES = {
    "allocator": ("PyTorch allocator LMS suites on the GPU: the patched c10's "
                  "(tests/conformance/pytorch_allocator) and the pluggable allocator's "
                  "(tests/conformance/lms_swap/test_lms_pluggable_allocator_gpu.py)",
                  "one JSON line per run: run, date, commit, machine, the scenario JSONs the suite "
                  "wrote, `summary` among them", ALLOCATOR_COLUMNS, allocator_rows),
    "tf_allocator": ("TensorFlow allocator program (tests/conformance/tensorflow_allocator) on the GPU",
                     "one JSON line per run: run, date, commit, machine, the result lines of its logs",
                     TF_COLUMNS, tf_rows),
    "victim_trace": ("Victim policies replayed on traced training steps (victim_trace.py)",
                     "one JSON line per traced model and run: the trace's meta, the step's peak "
                     "of live bytes, a row per capacity and policy", VICTIM_COLUMNS, victim_rows),
    "probes": ("One-off probes: single zoo configurations, the eviction net's cost, the driver's "
               "VMM calls, a pool region's growth",
               "one JSON line per file a run wrote: run, date, commit, machine, the file's data",
               PROBE_COLUMNS, probe_rows),
}


def write_table(name: str, path=None, recs=None) -> pathlib.Path:
    """Rewrite RESULTS-<name>.md (or ``path``) from records/<name>.jsonl (or ``recs``)."""
    title, what, columns, rows = TABLES[name]
    path = pathlib.Path(path or HERE / f"RESULTS-{name}.md")
    if recs is None:
        recs = records.load(records.RECORDS / f"{name}.jsonl")
    records.write_by_commit(path, recs, head(name, title, what, columns), [c for c, _ in columns],
                            rows, note)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-only", action="store_true",
                    help="rewrite the tables from the records (these benchmarks run elsewhere)")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help="which tables: " + ", ".join(TABLES) + " (default: all)")
    args = ap.parse_args(argv)
    if not args.table_only:
        ap.error("only --table-only: the suites and probes that wrote these records run elsewhere")
    unknown = [n for n in args.names if n not in TABLES]
    if unknown:
        ap.error(f"no table {unknown}; these are: {', '.join(TABLES)}")
    for name in args.names or TABLES:
        print(write_table(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
