"""The benchmark harness (examples/pytorch/benchmarks/bench_lms_swap.py) on CPU.

Each configuration runs in a child process in its own session, so a signal sent to the
parent does not reach the child by itself.  A child left running keeps its GPU memory,
and the next configuration then runs out of memory for a reason that is not its own
(seen on the H100).  These tests run real processes: the parent is stopped the way an
outer ``timeout`` or Ctrl-C stops it, and the child must be gone afterwards.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")  # bench_lms_swap imports the zoo, which imports torch

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "examples" / "pytorch" / "benchmarks"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (it holds no memory)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _stepping_child(tmp_path, before=""):
    """A child that runs ``before``, then prints a step every 0.1 s until killed."""
    child = tmp_path / "child.py"
    child.write_text("import json, os, time\n" + textwrap.dedent(before) + textwrap.dedent("""
        for i in range(10000):
            print("STEP " + json.dumps({"i": i, "s": 0.1}), flush=True)
            time.sleep(0.1)
    """))
    return child


def _parent(tmp_path, body):
    """A benchmark parent: the harness's children module, its stop handlers, then ``body``."""
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{str(BENCH)!r}]
        import children
        children.install_stop_handlers()
    """) + textwrap.dedent(body))
    return parent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_parent_ends_the_running_child(tmp_path, sig):
    pidfile = tmp_path / "child.pid"
    child = tmp_path / "child.py"  # stands in for the configuration: runs until killed
    child.write_text(textwrap.dedent(f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """))
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(BENCH)!r}, {str(BENCH.parent)!r}]
        import bench_lms_swap as bench
        bench.__dict__["__file__"] = {str(child)!r}  # run_child starts this file
        bench.install_stop_handlers()  # what main() does in the parent
        bench.run_child([], 600, 0, sys.stdout)
    """))
    p = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the child never started"
        time.sleep(0.1)
    child_pid = int(pidfile.read_text())
    assert _alive(child_pid)
    p.send_signal(sig)
    assert p.wait(timeout=30) == 128 + sig
    deadline = time.time() + 10
    while _alive(child_pid) and time.time() < deadline:
        time.sleep(0.1)
    alive = _alive(child_pid)
    if alive:
        os.kill(child_pid, signal.SIGKILL)
    assert not alive, "the child outlived its parent"



def test_a_parent_stopped_mid_run_leaves_the_runs_record_of_what_it_did(tmp_path):
    """An outer timeout stops the loops bench while a configuration runs: the child is
    ended, and the parent still has the steps it printed, under a status that says it
    was stopped, to record before it exits with 128 + the signal."""
    child = _stepping_child(tmp_path)
    out = tmp_path / "record.json"
    parent = _parent(tmp_path, f"""
        try:
            children.run_process([sys.executable, {str(child)!r}], 600, 0, open("/dev/null", "w"))
        except children.Stopped as e:
            open({str(out)!r}, "w").write(json.dumps(e.result))
            raise
    """)
    p = subprocess.Popen([sys.executable, str(parent)], stderr=subprocess.PIPE)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM, p.stderr.read().decode()
    rec = __import__("json").loads(out.read_text())
    assert rec["status"] == f"stopped with the benchmark (signal {int(signal.SIGTERM)})", rec
    assert rec["steps_done"] >= 5 and len(rec["step_s_seen"]) == rec["steps_done"], rec
    # each step's whole record, not only its time: a cut run's counters say where it lost it
    assert rec["steps_seen"][:2] == [{"i": 0, "s": 0.1}, {"i": 1, "s": 0.1}], rec


def test_a_stopped_parent_records_before_its_child_has_ended(tmp_path):
    """An outer ``timeout -k`` gives a stopped parent a few seconds before it kills it.  A
    child whose end takes longer (on the H100 one that had pinned 70 GB of host memory; here
    one whose output a process outside its group keeps open) must not hold the record back:
    the parent records what the child printed before it waits for the child's end."""
    holder = tmp_path / "holder.pid"
    child = _stepping_child(tmp_path, f"""
        if os.fork() == 0:  # leaves the child's process group, keeps its output open
            os.setsid()
            open({str(holder)!r}, "w").write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
    """)
    out = tmp_path / "record.json"
    parent = _parent(tmp_path, f"""
        children.run_process([sys.executable, {str(child)!r}], 600, 0, open("/dev/null", "w"),
                             on_result=lambda r: open({str(out)!r}, "w").write(json.dumps(r)))
    """)
    p = subprocess.Popen([sys.executable, str(parent)], stderr=subprocess.PIPE)
    try:
        time.sleep(3)
        p.send_signal(signal.SIGTERM)
        try:  # as timeout --kill-after=4 would
            p.wait(timeout=4)
        except subprocess.TimeoutExpired:
            p.kill()
        p.wait()
        assert out.exists(), p.stderr.read().decode()
        rec = __import__("json").loads(out.read_text())
        assert rec["status"] == f"stopped with the benchmark (signal {int(signal.SIGTERM)})", rec
        assert rec["steps_done"] >= 5, rec
    finally:
        if holder.exists():
            try:
                os.kill(int(holder.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _zoo_parent(tmp_path, child, *args):
    """A script that runs the zoo bench with ``args`` (besides its files under ``tmp_path``),
    every configuration's child being ``child``: the script, the record and the table."""
    record, table = tmp_path / "zoo.jsonl", tmp_path / "zoo.md"
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(BENCH)!r}, {str(BENCH.parent)!r}]
        import bench_lms_swap as bench
        bench.__dict__["__file__"] = {str(child)!r}  # run_child starts this file
        sys.argv = ["bench_lms_swap.py", *{list(args)!r}, "--link-probe-gib", "0", "--compile-net-s", "0",
                    "--out", {str(tmp_path / "out")!r}, "--record", {str(record)!r},
                    "--table", {str(table)!r}]
        sys.exit(bench.main())
    """))
    return parent, record, table


def _zoo_stopped_after(tmp_path, child, seconds):
    """The zoo bench over one lms configuration whose child is ``child``, stopped as an outer
    timeout stops it (SIGTERM) ``seconds`` after it started: its record and table files."""
    parent, record, table = _zoo_parent(tmp_path, child, "--models", "resnet50", "--base-batch",
                                        "resnet50=4", "--modes", "lms", "--scales", "1.5")
    p = subprocess.Popen([sys.executable, str(parent)], stderr=subprocess.PIPE)
    time.sleep(seconds)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM, p.stderr.read().decode()
    return record, table


def test_a_zoo_run_stopped_mid_configuration_still_writes_its_record(tmp_path):
    """The zoo bench writes one record per run, at its end.  An outer timeout that stops it
    while a configuration runs must still leave that record: the configurations before, and
    the one it cut with the steps it printed (an H100 run cut this way left none)."""
    child = _stepping_child(tmp_path)  # stands in for every configuration
    record, table = _zoo_stopped_after(tmp_path, child, 4)
    lines = record.read_text().splitlines()
    assert len(lines) == 1, lines
    (res,) = __import__("json").loads(lines[0])["results"]
    assert res["model"] == "resnet50" and res["batch"] == 6 and res["mode"] == "lms", res
    assert res["status"] == f"stopped with the benchmark (signal {int(signal.SIGTERM)})", res
    assert res["steps_done"] >= 5, res
    assert f"after {res['steps_done']} steps (the last took 0.1 s)" in table.read_text()
    # the steps' records go with the other runs' per-step traces, not into the record
    assert "steps_seen" not in res and "per_step" not in res, res
    import gzip
    with gzip.open(tmp_path / "zoo-per-step.jsonl.gz", "rt") as f:
        (trace,) = [__import__("json").loads(x) for x in f]
    assert trace["mode"] == "lms" and len(trace["per_step"]) == res["steps_done"], trace
    assert trace["per_step"][0] == {"i": 0, "s": 0.1}, trace


def test_the_zoo_budget_bounds_the_whole_run(tmp_path):
    """``--budget`` is the whole run's: the last configuration gets what is left of it, not
    a minute past it (an H100 run given 495 s ran on past 505 s, into the outer timeout)."""
    child = _stepping_child(tmp_path)  # never ends by itself: only the timeout ends it
    parent, record, _ = _zoo_parent(
        tmp_path, child, "--models", "resnet50", "unet", "--base-batch", "resnet50=4",
        "--base-batch", "unet=4", "--modes", "lms", "--scales", "1.5", "--timeout", "600",
        "--budget", "25")
    t0 = time.time()
    p = subprocess.run([sys.executable, str(parent)], capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    assert p.returncode == 0, p.stderr
    assert took < 25 + 15, took  # the budget, and the interpreter's start and the record
    (rec,) = [__import__("json").loads(x) for x in record.read_text().splitlines()]
    first, second = rec["results"]
    assert first["status"].startswith("timeout"), first
    assert second["status"] == "not run (time budget)", second


def test_the_zoo_runs_swapping_modes_only_at_their_scales(tmp_path):
    """``--lms-scales`` keeps the swapping modes to their scales: stock runs at 1.0x for the
    bound, the swapping mode at 1.5x and 2.0x only, not at 1.0x too (each configuration of a
    model at 1.0x costs a device call half a minute or more)."""
    child = tmp_path / "child.py"
    child.write_text("raise SystemExit(3)\n")  # every configuration fails at once
    parent, record, _ = _zoo_parent(
        tmp_path, child, "--models", "resnet50", "--base-batch", "resnet50=4", "--modes",
        "stock", "lms", "--scales", "1.0", "1.5", "2.0", "--lms-scales", "1.5", "2.0",
        "--baseline-scales", "1.0")
    p = subprocess.run([sys.executable, str(parent)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (rec,) = [__import__("json").loads(x) for x in record.read_text().splitlines()]
    rows = [(r["scale"], r["mode"]) for r in rec["results"]]
    assert rows == [(1.0, "stock"), (1.5, "lms"), (2.0, "lms")], rec["results"]


def _import(name):
    sys.path[:0] = [str(BENCH), str(BENCH.parent)]
    try:
        return __import__(name)
    finally:
        del sys.path[:2]


def test_a_job_s_grandchildren_and_garbled_records(tmp_path):
    """A torchrun job's workers are the child's children: they end with it.  Its ranks'
    RESULT lines are all kept; a garbled one is skipped, not fatal to the parent."""
    children = _import("children")
    pidfile = tmp_path / "grandchild.pid"
    script = (f"sleep 120 & echo $! > {pidfile}; "
              "echo 'RESULT {\"rank\": 0}'; echo 'RESULT {garbled'; echo 'RESULT {\"rank\": 1}'")
    log = open(tmp_path / "log.txt", "w", buffering=1)
    r = children.run_process(["bash", "-c", script], 60, 0, log)
    assert r["results"] == [{"rank": 0}, {"rank": 1}] and r["rank"] == 1
    assert "RESULT {garbled" in (tmp_path / "log.txt").read_text()
    deadline = time.time() + 10
    while _alive(int(pidfile.read_text())) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(int(pidfile.read_text()))


def test_distributed_plan_and_table(tmp_path):
    import argparse
    bd = _import("bench_distributed")
    GiB = 1 << 30
    two = bd.plan(argparse.Namespace(scales=[1.5], engines=["ddp", "fsdp"]), 2)
    assert two[:3] == [("ddp", 2, 1.0, False), ("ddp", 2, 1.5, True), ("fsdp", 2, 1.5, True)]
    assert ("ddp", 1, 1.5, True) in two and two[-1] == ("ddp", 2, 1.5, False)
    one = bd.plan(argparse.Namespace(scales=[1.5], engines=["ddp"]), 1)
    assert len(one) == len(set(one)) == 4          # no job twice on one GPU

    stock = {("ddp", 2): {"step_s": 1.0, "batch": 100}}
    rank = {"batch": 150, "lms": True, "step_s": 2.0, "units_per_s": 75.0, "unit": "img/s",
            "out_bytes_per_step": 54e9, "in_bytes_per_step": 53e9, "peak_host_rss": 60 * GiB}
    row = {"engine": "ddp", "nproc": 2, "scale": 1.5, "batch": 150, "lms": True, "status": "ok",
           "host_total": 256 * GiB, "min_mem_available": 130 * GiB,
           "results": [dict(rank, rank=1, step_s=2.5), dict(rank, rank=0)]}
    bd.summarize(row, stock, {})
    assert row["step_s"] == 2.5 and row["units_per_s"] == 150.0   # slowest rank; all ranks
    assert [d["rank"] for d in row["per_rank"]] == [0, 1]
    assert [d["pct_of_bound"] for d in row["per_rank"]] == [100.0, 80.0]  # 2 s of PCIe
    assert row["node_peak_host_rss"] == 120 * GiB and row["node_host_used_peak"] == 126 * GiB
    oom = {"engine": "ddp", "nproc": 2, "scale": 1.5, "batch": 150, "lms": False,
           "status": "CUDA OOM", "error": "CUDA out of memory.", "results": []}
    meta = {"command": "c", "model": "resnet50", "base_batch": 100, "base_batch_from": "given",
            "max_gpu_gib": None, "node_budget": 200 * GiB, "host_total": 256 * GiB}
    bd.write(tmp_path, meta, [row, oom])
    md = (tmp_path / "results.md").read_text()
    assert "| ddp | 2 | 1.5x | 150 | lms | ok |" in md and "**CUDA OOM**: CUDA out of memory." in md
    assert all(line.count("|") == 17 for line in md.splitlines() if line.startswith("| ddp"))


def test_bounds_at_facts_rates_and_at_the_probed_link(tmp_path):
    """The bound of an lms row: max(compute, copy term) with stock's 1.0x rate, the copy
    term alone without it (marked), and the same at this host's measured link rates."""
    import argparse
    bench = _import("bench_lms_swap")
    link = {"d2h_gbps": 27.0, "h2d_gbps": 26.5, "both_ways_gbps_each": 20.0}
    row = {"model": "unet", "scale": 2.0, "batch": 200, "mode": "lms", "status": "ok",
           "units_per_s": 50.0, "unit": "img/s", "step_s": 4.0,
           "out_bytes_per_step": 54e9, "in_bytes_per_step": 53e9}
    alone = dict(row)
    bench.add_bounds(alone, None, link)          # no stock in this run: the copy term
    assert not alone["bound_has_compute"] and "compute_step_s" not in alone
    assert abs(alone["frac_of_bound"] - 0.5) < 1e-9           # 2 s of 4 at FACTS.md's rates
    assert abs(alone["frac_of_probed_bound"] - 1.0) < 1e-9    # 4 s at half those rates
    slow_stock = dict(row)
    bench.add_bounds(slow_stock, 40.0, None)     # compute 200/40 = 5 s: over the copy term
    assert slow_stock["bound_has_compute"] and abs(slow_stock["frac_of_bound"] - 1.25) < 1e-9
    assert "frac_of_probed_bound" not in slow_stock
    args = argparse.Namespace(optimizer="adamw", seq_len=2048, loss_chunk=0, alloc_conf="x",
                              warmup=6, steps=14, min_seconds=0)
    bench.write_markdown(tmp_path / "r.md", "c", [alone, slow_stock], args, link)
    md = (tmp_path / "r.md").read_text()
    assert "27.0 GB/s out, 26.5 in, 20.0 each way at once" in md
    assert "| 50.0%* | 100.0% |" in md and "| 125.0% | - |" in md


def test_zoo_table_is_written_from_records(tmp_path):
    """RESULTS-zoo.md comes from records/zoo.jsonl: a section per record, the newest first."""
    bench = _import("bench_lms_swap")
    row = {"model": "unet", "scale": 2.0, "batch": 200, "mode": "lms", "status": "ok",
           "units_per_s": 50.0, "unit": "img/s", "step_s": 4.0, "frac_of_bound": 0.5}
    old = {"run": "7", "date": "2026-11-22", "commit": None, "machine": {"gpu": "H100"},
           "torch": None, "source": "h100-run7", "command": "c7", "results": [row]}
    new = dict(old, run="8", commit="abc1234", torch="2.11", source=None, command="c8",
               link={"d2h_gbps": 27.0, "h2d_gbps": 26.5})
    bench.write_table(tmp_path / "t.md", [old, new])
    md = (tmp_path / "t.md").read_text()
    assert md.index("## run 8, 2026-11-22, commit abc1234, H100, torch 2.11") < md.index(
        "## run 7, 2026-11-22, commit unknown, H100, folder `h100-run7`")
    assert "27.0 GB/s out, 26.5 in" in md and md.count("| unet | 2.0x | 200 | lms | ok |") == 2


# Every RESULTS-*.md is written by code from its records: (table, module, how it is written).
def _write_zoo(m, recs, path):
    m.write_table(path, recs)


def _write_loops(m, recs, path):
    m.write_table(path, recs)


def _write_distributed(m, recs, path):
    m.write_table(path, recs)


TABLES = {
    "zoo": ("bench_lms_swap", _write_zoo),
    "loops": ("bench_loops", _write_loops),
    "distributed": ("bench_distributed", _write_distributed),
    **{name: ("record_tables", lambda m, recs, path, name=name: m.write_table(name, path, recs))
       for name in ("allocator", "tf_allocator", "victim_trace", "probes")},
}


def test_every_results_table_has_a_writer():
    assert sorted(p.name for p in BENCH.glob("RESULTS-*.md")) == sorted(
        f"RESULTS-{n}.md" for n in TABLES)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_committed_table_is_what_its_records_give(tmp_path, name):
    """A table edited by hand, or records changed without regenerating it, fails here."""
    records = _import("records")
    module, write = TABLES[name]
    out = tmp_path / f"RESULTS-{name}.md"
    write(_import(module), records.load(BENCH / "records" / f"{name}.jsonl"), out)
    assert out.read_text() == (BENCH / f"RESULTS-{name}.md").read_text(), (
        f"RESULTS-{name}.md differs from its records: regenerate it (README.md says how)")


def test_record_tables_on_one_real_record_each(tmp_path):
    """Each of the four writers on the first record of its file: the section names its
    commit, runs and where the commands are, and the rows carry the record's figures."""
    import json
    rt = _import("record_tables")

    def first(name):
        return json.loads((BENCH / "records" / f"{name}.jsonl").open().readline())

    def md(name, rec):
        return rt.write_table(name, tmp_path / f"{name}.md", [rec]).read_text()

    alloc = first("allocator")  # run 106, b535afc
    text = md("allocator", alloc)
    assert "## Commit b535afc" in text and "106 (`h100-run104/r106`)" in text
    assert "the notes of `h100-run104` in `records/runs.jsonl`" in text
    bw = alloc["tests"]["bandwidth_lms"]
    spill = "/".join(f"{x['out_gbps'] / bw['ref_d2h_gbps']:.2f}" for x in bw["rounds"])
    assert f"| 106 | bandwidth_lms | ran | 0 | spill {spill}, return" in text
    assert "| 106 | summary |" not in text
    assert text.count("\n| 106 | ") == len(alloc["tests"]) - 1

    text = md("tf_allocator", first("tf_allocator"))  # run 107: a failed CHECK, rc=134
    assert "| 107 | tf_writers.log | Check failed; rc=134 | 0 |" in text

    vt = first("victim_trace")
    text = md("victim_trace", vt)
    row = vt["rows"][0]
    assert (f"| {vt['run']} | {vt['model']}, batch {vt['meta']['batch']} | {row['fraction']} "
            f"({row['capacity'] / (1 << 30):.1f} GiB) | {row['policy']} |") in text
    assert text.count(f"\n| {vt['run']} | ") == len(vt["rows"])

    pr = first("probes")  # a zoo configuration's results.json: the command is in the record
    text = md("probes", pr)
    assert f"Commands: `{pr['data']['command']}`." in text and "Commands not in the records" not in text
    res = pr["data"]["results"][0]
    assert f"| {pr['run']} | {pr['probe']} | bench_lms_swap.py | {res['model']} {res['scale']}x" in text


def test_per_step_traces_are_kept_apart(tmp_path):
    """The zoo's per-step lines go to a gzipped file beside the records, keyed so that each
    goes back to its result; the record and its table keep everything else."""
    records = _import("records")
    rec = {"run": "9", "date": "d", "commit": "c", "command": "x",
           "results": [{"model": "unet", "scale": 1.5, "batch": 6, "mode": "lms",
                        "per_step": [{"kind": "timed", "s": 1.0}]},
                       {"model": "unet", "scale": 1.0, "batch": 4, "mode": "stock"}]}
    path = tmp_path / "zoo.jsonl"
    records.append_with_traces(path, rec)
    assert records.traces_path(path).name == "zoo-per-step.jsonl.gz"
    [kept] = records.load(path)
    assert all("per_step" not in r for r in kept["results"]) and kept["command"] == "x"
    [t] = records.load_traces(path)
    assert t == {"run": "9", "date": "d", "commit": "c", "result": 0, "model": "unet",
                 "scale": 1.5, "batch": 6, "mode": "lms", "per_step": [{"kind": "timed", "s": 1.0}]}
    # the committed zoo records: every trace finds exactly one result that lacks it
    zoo = records.load(BENCH / "records" / "zoo.jsonl")
    for t in records.load_traces(BENCH / "records" / "zoo.jsonl"):
        [r] = [r for r in zoo if all(r.get(k) == t.get(k) for k in records.TRACE_KEYS)]
        res = r["results"][t["result"]]
        assert (res["model"], res["scale"], res["mode"]) == (t["model"], t["scale"], t["mode"])
        assert "per_step" not in res


def test_a_run_cut_after_its_result_keeps_it_and_one_cut_before_does_not(tmp_path):
    """Both benches: a child that printed its result and was then cut by the timeout (while
    exiting) is that result, marked (and said so in the zoo's table); one cut before printing
    it stays a timeout."""
    children, zoo_report = _import("children"), _import("zoo_report")
    log = open(tmp_path / "log.txt", "w", buffering=1)
    done = ('echo \'RESULT {"loop": "varlen-decoder", "status": "ok", "steps": [1, 2]}\'; '
            "exec sleep 60")
    r = children.finished_before_cut(children.run_process(["bash", "-c", done], 3, 0, log),
                                     "loop", "varlen-decoder")
    assert r["status"] == "ok" and r["steps"] == [1, 2], r
    assert r["cut_after_result"].startswith("timeout") and "wall_s" in r and "results" not in r
    cut = children.finished_before_cut(children.run_process(["bash", "-c", "exec sleep 60"], 3, 0,
                                                            log), "loop", "varlen-decoder")
    assert cut["status"].startswith("timeout") and "cut_after_result" not in cut, cut
    row = {"model": "llama", "scale": 1.5, "batch": 27, "mode": "pluggable", "status": "ok",
           "units_per_s": 1.0, "unit": "tok/s", "step_s": 4.0, "cut_after_result": "timeout (70s)"}
    [line] = zoo_report.table_rows([row])
    assert "| ok (timeout hit while it exited, after its result) |" in line, line


def test_a_loops_row_cut_by_the_timeout_says_how_far_it_ran(tmp_path):
    """The loops table: a configuration the harness's timeout cut shows the iterations it ran
    and the last one's time, not the tail of what the child printed."""
    bench = _import("bench_loops")
    rec = {"loop": "ckpt-decoder", "scale": 2.0, "batch": 144, "mode": "lms", "commit": "c0ffee0",
           "machine": {"gpu": "H100"}, "torch": "2.11.0", "command": "python bench_loops.py",
           "steps_asked": 30, "status": "timeout (285.80765383s)", "steps_done": 28,
           "error": '043814912, "policy.dev0.backward_peak_bytes": 65666918904',
           "step_s_seen": [51.9] + [7.5] * 27}
    bench.write_table(tmp_path / "t.md", [rec])
    text = (tmp_path / "t.md").read_text()
    assert "timeout (286 s) after 28 of 30 iterations (the last took 7.5 s)" in text, text
    assert "policy.dev0" not in text


def test_a_row_cut_by_the_run_s_budget_says_so_not_timeout(tmp_path):
    """A configuration whose limit was what was left of the whole run's budget (less than
    --timeout) reads as cut by the budget, so nobody takes it for the mode being too slow."""
    bench = _import("bench_loops")
    rec = {"loop": "ckpt-decoder", "scale": 2.0, "batch": 144, "mode": "lms", "commit": "c0ffee0",
           "machine": {"gpu": "H100"}, "torch": "2.11.0", "command": "python bench_loops.py",
           "steps_asked": 30, "status": "timeout (37.38725545700004s)", "steps_done": 0,
           "cut_by_budget": True, "step_s_seen": []}
    bench.write_table(tmp_path / "t.md", [rec])
    text = (tmp_path / "t.md").read_text()
    assert "cut by the run's time budget (37 s left) after 0 of 30 iterations" in text, text
    assert "timeout (37 s)" not in text


def test_a_cut_row_gives_the_figures_of_the_timed_iterations_it_finished(tmp_path):
    """A run cut after some of its timed iterations: the table gives what those measured
    (named as theirs), against stock's same iterations, in the loop's unit."""
    bench = _import("bench_loops")
    head = {"loop": "ckpt-some", "commit": "c0ffee0", "machine": {"gpu": "H100"},
            "torch": "2.11.0", "command": "python bench_loops.py", "steps_asked": 4}
    stock = {**head, "scale": 1.0, "batch": 24, "mode": "stock", "status": "ok",
             "unit": "tok/s", "units_per_s": 100.0, "steps_done": 4,
             "steps": [{"i": i, "units": 100, "s": 1.0, "timed": i >= 2} for i in range(4)]}
    # two of three iterations ran, one timed: 200 units in 4 s, 54 GB out and 53 in (2 s of
    # copies) against stock's 1 s for 100 units (2 s for 200): 2 s of bound in 4 s
    seen = [{"i": 0, "units": 200, "s": 9.0, "timed": False},
            {"i": 2, "units": 200, "s": 4.0, "timed": True,
             "swap.out_bytes": 54e9, "swap.in_bytes": 53e9}]
    cut = {**head, "scale": 2.0, "batch": 48, "mode": "lms", "status": "timeout (175.0s)",
           "cut_by_budget": True, "steps_done": 2, "step_s_seen": [9.0, 4.0],
           "steps_seen": seen}
    cut["cut_figures"] = bench.cut_figures(cut, stock)   # as the harness keeps them
    bench.write_table(tmp_path / "t.md", [stock, cut])
    text = (tmp_path / "t.md").read_text()
    assert ("cut by the run's time budget (175 s left) after 2 of 4 iterations (the last "
            "took 4.0 s); its 1 timed iteration: 50.0% of the bound, 50 tok/s, net 0, "
            "54.0 / 53.0 GB each way") in text, text


def test_a_loops_config_limited_by_the_budget_is_marked(tmp_path, monkeypatch):
    """The harness marks a row whose limit the remaining budget set (100 s left, --timeout 300)."""
    bench = _import("bench_loops")
    seen = []

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        seen.append(timeout)
        r = {"status": "timeout (99.0s)", "steps_done": 0}
        on_result(r)
        return r

    monkeypatch.setattr(bench, "run_process", fake_run)
    monkeypatch.setattr(sys, "argv", ["bench_loops.py", "--loops", "ckpt-some", "--base-batch",
                                      "ckpt-some=24", "--modes", "stock", "--scales", "1.0",
                                      "--timeout", "300", "--budget", "100",
                                      "--record", str(tmp_path / "r.jsonl"),
                                      "--table", str(tmp_path / "t.md")])
    bench.main()
    rows = [json.loads(x) for x in open(tmp_path / "r.jsonl")]
    assert rows[0].get("cut_by_budget") is True and seen[0] <= 100


def test_the_loops_iteration_lines_go_beside_the_record(tmp_path, monkeypatch):
    """Each configuration's per-iteration lines go to the gzipped traces beside the record,
    not into it, and the run's stock row still gives the rows after it their bound."""
    bench = _import("bench_loops")
    records = _import("records")

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        if "--compile-net" in argv:
            return {"status": "ok", "net": "ready", "s": 1.0}
        mode = argv[argv.index("--mode") + 1]
        r = {"status": "ok", "steps_done": 2, "unit": "tok/s",
             "steps": [{"i": i, "units": 100, "s": 1.0 if mode == "stock" else 2.0,
                        "timed": i == 1} for i in range(2)]}
        on_result(r)
        return r

    monkeypatch.setattr(bench, "run_process", fake_run)
    rec = tmp_path / "r.jsonl"
    monkeypatch.setattr(sys, "argv", ["bench_loops.py", "--loops", "ckpt-some", "--base-batch",
                                      "ckpt-some=24", "--modes", "stock", "lms", "--scales",
                                      "1.0", "1.5", "--lms-scales", "1.5", "--record", str(rec),
                                      "--table", str(tmp_path / "t.md")])
    bench.main()
    rows = [json.loads(x) for x in open(rec)]
    assert [r["mode"] for r in rows] == ["stock", "lms"]
    assert all("steps" not in r for r in rows)
    assert rows[1]["bound_has_compute"] is True          # against stock's own iterations
    traces = records.load_traces(rec)
    assert [(t["mode"], len(t["steps"])) for t in traces] == [("stock", 2), ("lms", 2)]


def test_lms_variants_run_against_one_stock_run(tmp_path, monkeypatch):
    """--lms-variant runs each lms configuration once per variant, after one stock run that
    gives all of them their bound; the children get the variant's tunables and the rows name
    them.  A malformed variant is refused before anything runs."""
    bench = _import("bench_loops")
    argvs = []

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        argvs.append(argv)
        if "--compile-net" in argv:
            return {"status": "ok", "net": "unavailable", "reason": "RuntimeError: no CUDA"}
        r = {"status": "ok", "steps_done": 2, "unit": "tok/s",
             "steps": [{"i": i, "units": 100, "s": 1.0, "timed": i == 1} for i in range(2)]}
        on_result(r)
        return r

    monkeypatch.setattr(bench, "run_process", fake_run)
    rec = tmp_path / "r.jsonl"
    common = ["bench_loops.py", "--loops", "ckpt-some", "--base-batch", "ckpt-some=24",
              "--modes", "stock", "lms", "--scales", "1.0", "2.0", "--lms-scales", "2.0",
              "--record", str(rec), "--table", str(tmp_path / "t.md")]
    monkeypatch.setattr(sys, "argv", common + ["--lms-variant", "defaults", "--lms-variant",
                                               "prefetch_past_peak=0,prefetch_depth=8"])
    bench.main()
    rows = [json.loads(x) for x in open(rec)]
    assert [(r["mode"], r.get("lms_options")) for r in rows] == [
        ("stock", None), ("lms", None), ("lms", ["prefetch_past_peak=0", "prefetch_depth=8"])]
    assert all(r["bound_has_compute"] for r in rows[1:])
    # the net is compiled once, before every configuration, and what it answered is kept
    assert "--compile-net" in argvs[0] and not any("--compile-net" in a for a in argvs[1:])
    assert rows[0]["net_compile"] == {"net": "unavailable", "reason": "RuntimeError: no CUDA"}
    assert argvs[3][-4:] == ["--lms-option", "prefetch_past_peak=0",
                             "--lms-option", "prefetch_depth=8"]
    assert "--lms-option" not in argvs[2]
    for bad in ("prefetch_past_peak", "=1", ""):
        monkeypatch.setattr(sys, "argv", common + ["--lms-variant", bad])
        with pytest.raises(SystemExit):
            bench.main()
    assert len(argvs) == 4


def test_a_loops_row_names_the_tunables_it_ran_with(tmp_path):
    """Two lms rows of one run that differ only in an lms_swap tunable (--lms-option) are
    told apart in the table: the options stand beside the mode."""
    bench = _import("bench_loops")
    base = {"loop": "ckpt-some", "scale": 1.5, "batch": 36, "mode": "lms", "commit": "c0ffee0",
            "machine": {"gpu": "H100"}, "torch": "2.11.0", "command": "python bench_loops.py",
            "steps_asked": 30, "status": "ok", "steps_done": 30, "net_interventions": 0,
            "net_interventions_all": 2, "out_gb_per_iter": 33.3, "in_gb_per_iter": 33.3}
    bench.write_table(tmp_path / "t.md", [base, {**base, "lms_options": ["prefetch_depth=96"]}])
    text = (tmp_path / "t.md").read_text()
    assert "| ckpt-some | 1.5x | 36 | lms | ok |" in text
    assert "| ckpt-some | 1.5x | 36 | lms (prefetch_depth=96) | ok |" in text


def test_a_loops_row_is_compared_with_the_stock_row_of_its_own_commit(tmp_path):
    """The loops table's "vs stock 1.0x": each row against its loop's stock 1.0x row of the
    same commit on the same GPU (an older commit's stock is other code, maybe another card),
    and "-" where that commit ran no stock."""
    bench = _import("bench_loops")

    def rec(commit, mode, ups, scale=1.0):
        return {"loop": "ckpt-decoder", "scale": scale, "batch": 72, "mode": mode,
                "commit": commit, "machine": {"gpu": "H100"}, "torch": "2.11.0",
                "command": f"python bench_loops.py {commit}", "steps_asked": 30,
                "status": "ok", "steps_done": 30, "units_per_s": ups, "unit": "tok/s",
                "net_interventions": 0, "net_interventions_all": 0, "out_gb_per_iter": 1.0,
                "in_gb_per_iter": 1.0}
    recs = [rec("aaaaaaa", "stock", 50000.0), rec("bbbbbbb", "lms", 45000.0, 1.5),
            rec("bbbbbbb", "stock", 60000.0), rec("ccccccc", "lms", 30000.0, 1.5)]
    bench.write_table(tmp_path / "t.md", recs)
    cells = {}
    for line in (tmp_path / "t.md").read_text().splitlines():
        if line.startswith("| ckpt-decoder"):
            c = [x.strip() for x in line.strip("|").split("|")]
            cells[(c[3], c[6])] = c[7]                     # (mode, units/s) -> vs stock
    assert cells[("lms", "45000 tok/s")] == "75.0%"        # bbbbbbb's stock, after it
    assert cells[("stock", "60000 tok/s")] == "100.0%"
    assert cells[("lms", "30000 tok/s")] == "-"            # ccccccc ran no stock


def test_a_run_held_to_a_smaller_card_says_so(tmp_path, monkeypatch):
    """--device-gib: a bad size is refused at the command line, the size reaches the
    children through the environment, and the record and its table name the card with the
    size it was held to (a run on an H200 held to the H100's size reads as such)."""
    cap = _import("device_cap")
    records = _import("records")
    assert abs(cap.parse("h100") - 85_017_853_952 / (1 << 30)) < 1e-9
    assert cap.parse("40") == 40.0
    for bad in ("0", "-3", "nan", "inf", "eighty"):
        with pytest.raises(Exception) as e:
            cap.parse(bad)
        assert bad in str(e.value)
    p = subprocess.run([sys.executable, str(BENCH / "bench_loops.py"), "--device-gib", "0",
                        "--table-only"], capture_output=True, text=True)
    assert p.returncode == 2 and "--device-gib" in p.stderr, p.stderr
    monkeypatch.delenv(cap.ENV, raising=False)
    assert cap.gib() is None and "device_gib" not in records.machine()
    monkeypatch.setenv(cap.ENV, repr(cap.parse("h100")))
    m = dict(records.machine(), gpu="NVIDIA H200, 580.159.04")
    assert records.gpu_label(m) == "NVIDIA H200, 580.159.04, held to 79.2 GiB (an H100's size)"
    assert records.gpu_label({"gpu": "NVIDIA H100 80GB HBM3"}) == "NVIDIA H100 80GB HBM3"
    monkeypatch.setenv(cap.ENV, "zero")
    with pytest.raises(SystemExit):
        cap.gib()


def test_a_stop_while_a_finished_child_exits_keeps_its_result(tmp_path):
    """A child that printed its result and is still exiting (one that pinned tens of GB of
    host memory takes seconds) when the bench is stopped: its row is recorded with the
    result it printed, not as cut."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import json, time
        print("RESULT " + json.dumps({
            "model": "resnet50", "mode": "lms", "batch": 6, "status": "ok",
            "units_per_s": 12.5, "unit": "img/s", "step_s": 0.48, "timed_steps": 14,
            "timed_alloc_retries": 0, "out_bytes_per_step": 2e9, "in_bytes_per_step": 2e9,
            "peak_alloc": 1 << 30, "peak_reserved": 1 << 30}), flush=True)
        time.sleep(60)  # its exit, slow
    """))
    record, table = _zoo_stopped_after(tmp_path, child, 4)
    lines = record.read_text().splitlines()
    assert len(lines) == 1, lines
    (res,) = __import__("json").loads(lines[0])["results"]
    assert res["status"] == "ok" and res["units_per_s"] == 12.5, res
    assert res["stopped_after_result"].startswith("stopped with the benchmark"), res
    assert abs(res["frac_of_bound"] - (2e9 / 54e9 + 2e9 / 53e9) / 0.48) < 1e-6, res


def test_every_allocator_counter_a_step_records_is_one_the_lms_core_prints():
    """The benches record the pluggable allocator's counters by name from the text its LMS
    core prints; a name the core does not print would read 0 in every step, unnoticed."""
    allocator_memory = _import("allocator_memory")
    printed = set()
    for src in [*(REPO / "patches").rglob("*.cpp"), *(REPO / "patches").rglob("*.inc")]:
        text = src.read_text(errors="replace")
        printed.update(__import__("re").findall(r'"([\w.]+)(?:=|",)', text))
    missing = [k for k in allocator_memory.ALLOC_TOTALS if k not in printed]
    assert not missing, missing

    class _Alloc:  # what lms_swap.allocator.lms_stats hands over: ints, a key it may lack
        @staticmethod
        def lms_stats():
            return {"swap_out_bytes": 7, "launch_gate.inactive_reason": "none"}
    got = allocator_memory.alloc_totals(_Alloc)
    assert got["alloc.swap_out_bytes"] == 7 and got["alloc.swap_in_time_ns"] == 0
    assert set(got) == {f"alloc.{k}" for k in allocator_memory.ALLOC_TOTALS}


def _trace(path):
    """A profiled step as torch.profiler writes it, cut to what profile_step.py reads: the
    phase ranges, runtime calls with their correlation ids, kernels on the compute stream,
    copies on a side stream, and one allocation that blocks the CPU twice."""
    import gzip
    import json
    ev = []

    def x(name, ts, dur, cat="cpu_op", tid=1, **args):
        ev.append({"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid,
                   "args": args})

    x("lms_forward", 0, 1000, cat="user_annotation")
    x("lms_backward", 1000, 1000, cat="user_annotation")
    x("aten::empty_strided", 100, 600)
    x("cudaEventSynchronize", 200, 200, cat="cuda_runtime")
    x("cudaEventSynchronize", 400, 300, cat="cuda_runtime")
    for i, at in enumerate((10, 20, 800, 1100, 1200)):
        x("cudaLaunchKernel", at, 1, cat="cuda_runtime", correlation=i)
        x("k", at + 5, 50, cat="kernel", tid=7, stream=7, correlation=i)
    x("cudaMemcpyAsync", 30, 1, cat="cuda_runtime", correlation=9)
    x("Memcpy DtoH", 40, 500, cat="gpu_memcpy", tid=13, stream=13, correlation=9,
      bytes=27_000_000)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


def test_a_profile_s_figures_are_a_record_and_a_probes_row(tmp_path):
    """profile_step.py's analysis returns what it prints: the CPU's blocks by call and op,
    the compute stream's busy time and gaps per phase, the side stream's copies; a record of
    them is a row of the probes table."""
    ps = _import("profile_step")
    rt = _import("record_tables")
    _trace(tmp_path / "t.json.gz")
    out = ps.analyse(str(tmp_path / "t.json.gz"))
    assert out["blocking"] == {"cudaEventSynchronize in aten::empty_strided": {
        "count": 2, "ms": 0.5, "from_ms": 0.2, "to_ms": 0.7}}
    assert out["compute"]["busy_ms"] == 0.2 and out["compute"]["gaps"] == 1
    assert out["compute"]["largest_gaps"][0] == [0.1, 0.7, "forward"]
    assert out["phases"]["forward"]["busy_ms"] == 0.1
    side = out["side_streams"][0]
    assert side["gb"] == 0.03 and side["gb_s"] == 54.0 and side["launched"]["forward"]["copies"] == 1
    rec = {"run": "9", "date": "2026-12-01", "commit": "abc1234", "machine": {"gpu": "G"},
           "torch": "2.11", "probe": "profile_ckpt-some_36_lms", "data": {"profile": {
               "what": "ckpt-some", "batch": 36, "mode": "lms", "lms_options": [],
               "timed": [{"gpu_s": {"forward": 0.8, "backward": 0.75}, "step_s": 1.57,
                          "peak_gib": 71.2, "alloc_retries": {"forward": 1}}],
               "profiled_step": out}}}
    text = rt.write_table("probes", tmp_path / "probes.md", [rec]).read_text()
    assert ("| 9 | profile_ckpt-some_36_lms | profile_step.py | ckpt-some batch 36 lms: "
            "1.570-1.570 s a step (forward 0.800, backward 0.750 on the GPU); profiled: "
            "compute busy 0.2 of 1.2 ms, 1 gaps of 0.7 ms; copies 0.03 GB at 54.0 GB/s "
            "(0.0-0.5 ms); longest CPU block: 2x cudaEventSynchronize in aten::empty_strided, "
            "0.5 ms |") in text


@pytest.mark.parametrize("bench", ["bench_loops.py", "bench_lms_swap.py"])
def test_the_net_compile_child_answers_for_this_machine(bench):
    """The child each bench runs before its configurations compiles the eviction net or says
    why it cannot be had (on a machine without CUDA: unavailable, with the reason), as one
    RESULT line the parent reads."""
    p = subprocess.run([sys.executable, str(BENCH / bench), "--child", "--compile-net"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, p.stdout
    r = json.loads(lines[0][len("RESULT "):])
    if r["net"] == "ready":
        assert r["s"] >= 0
    else:
        assert r["net"] == "unavailable" and r["reason"]


def test_backward_memory_says_which_interval_set_backwards_peak(m):
    """backward_memory.py's summary of backwards recorded by lms_swap's BackwardProfile
    (through its observer): the peak before the first unpack moves with forward's end, one
    at backward's end does not, and the summary names the interval that was highest."""
    import lms_swap.backward_profile as bp
    tool = _import("backward_memory")
    GB = 10 ** 9
    events, at = [], [0]
    bp.observe(lambda kind, f: events.append((kind, f, at[0])))
    try:
        for step, end in enumerate((30 * GB, 45 * GB)):
            at[0] = step
            prof = bp.BackwardProfile()
            prof.begin(end)
            prof.boundary(70 * GB, 25 * GB, end + 10 * GB)   # the loss: 25 GB over the end
            prof.boundary(0, 5 * GB, 55 * GB)                # late: 55 GB whatever forward did
            prof.end(12 * GB, 0, 78 * GB)
    finally:
        bp.observe(None)
    first, second = [tool.summary(b) for b in tool.backwards(events)]
    assert first["step"] == 0 and second["step"] == 1
    assert first["highest"]["offset_gb"] == 0 and first["highest"]["peak_gb"] == 67
    assert first["over_forward_end_gb"] == 37
    assert second["highest"]["offset_gb"] is None and second["highest"]["peak_gb"] == 70
    assert second["over_forward_end_gb"] == 25
    text = tool.line(second, {"swap.out_bytes": 72 * GB})
    assert "highest 70.0 (interval 0 of 3, before the first unpack" in text, text
    rt = _import("record_tables")
    kind, figures = rt._probe({"backward_memory": {"what": "ckpt-some", "batch": 48,
                                                   "backwards": [first, second]}})
    assert kind == "backward_memory.py"
    assert "step 1: end 45.0, first 70.0, highest 70.0 (first), last 67.0 GB" in figures, figures
    _, figures = rt._probe({"backward_memory": {
        "what": "ckpt-some", "batch": 24, "mode": "stock", "backwards": [],
        "steps": [{"i": 0, "layers": [["model.layers.11", 30.0], ["model.layers.0", 41.5],
                                       ["lm_head", 52.0], ["model.layers.1", 44.0]]}]}})
    assert figures == "ckpt-some batch 24 stock: step 0 layers 30.0-52.0-44.0 GB", figures


def test_backward_memory_groups_what_is_live_by_where_it_was_allocated(m):
    """--live-step's summary: blocks of a real allocator snapshot's form grouped by the
    innermost frames outside torch's files, recomputation marked, those live at forward's
    end told apart by address and size; record_tables shows the largest groups."""
    tool = _import("backward_memory")
    GB = 10 ** 9
    # a library in a folder whose path names torch is the caller's, not torch's
    llama = {"filename": "/opt/torch/site-packages/transformers/models/llama/modeling_llama.py",
             "line": 90, "name": "forward"}
    recompute = {"filename": "/opt/torch/site-packages/torch/utils/checkpoint.py", "line": 1,
                 "name": "recompute_fn"}
    linear = {"filename": "/opt/torch/site-packages/torch/nn/modules/linear.py", "line": 5,
              "name": "forward"}

    def snap(*blocks):
        return {"segments": [{"blocks": [dict(b, state=b.get("state", "active_allocated"))
                                         for b in blocks]}]}
    torch_dir = "/opt/torch/site-packages/torch"
    forward_end = tool.live_blocks(snap(
        {"address": 0, "size": 3 * GB, "frames": [linear, llama]},
        {"address": 9 * GB, "size": GB, "frames": [], "state": "inactive"}), torch_dir)
    assert forward_end == [(0, 3 * GB, "modeling_llama.py:90 forward")]
    now = tool.live_blocks(snap(
        {"address": 0, "size": 3 * GB, "frames": [linear, llama]},
        {"address": 5 * GB, "size": 2 * GB, "frames": [linear, llama, recompute]},
        {"address": 7 * GB, "size": 2 * GB, "frames": [linear, llama, recompute]},
        {"address": 10 * GB, "size": GB, "frames": []}), torch_dir)
    live = tool.live_summary(forward_end, now)
    assert live["live_gb"] == 8 and live["from_forward_gb"] == 3
    assert live["groups"][0] == {"when": "backward",
                                 "site": "modeling_llama.py:90 forward [recomputed]",
                                 "gb": 4.0, "blocks": 2, "sizes_gb": [[2.0, 2]]}
    assert live["groups"][1]["when"] == "forward" and live["groups"][1]["gb"] == 3.0
    assert live["groups"][2]["site"] == "(no Python frame)"
    rt = _import("record_tables")
    _, figures = rt._probe({"backward_memory": {
        "what": "ckpt-some", "batch": 24, "mode": "stock", "backwards": [], "steps": [],
        "live": live, "live_step": 4, "live_layer": "model.layers.0"}})
    assert figures.startswith("ckpt-some batch 24 stock: live at step 4's model.layers.0: "
                              "8.0 GB (3.0 from forward's end; 4.0 backward modeling_llama.py"), figures


def test_backward_memory_watches_the_layers_of_a_models_stacks(m, monkeypatch):
    """watch_layers hooks each child with parameters of a ModuleList or Sequential, and each
    reports as backward reaches its output, last layer first (no GPU: the allocation reads 0)."""
    import torch
    tool = _import("backward_memory")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 1))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    net, seen = Net(), []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)  # (no GPU here)
    assert tool.watch_layers(net, torch, seen) == 4     # three layers, the head's Linear
    net(torch.randn(2, 4)).sum().backward()
    assert [x[0] for x in seen] == ["head.1", "layers.2", "layers.1", "layers.0"]
    with torch.no_grad():
        net(torch.randn(2, 4))
    assert len(seen) == 4
