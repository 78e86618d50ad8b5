"""What a benchmark run puts in its rows, on CPU: the budget and the time limits, the
scales each mode runs at, the bounds, the tunables a row ran with and the stock row it is
compared with, and how far a cut configuration got.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from bench_fixtures import BENCH, import_bench, stepping_child, zoo_parent

pytest.importorskip("torch")  # bench_lms_swap imports the zoo, which imports torch


def _zoo_rows(tmp_path, child, *args):
    """The zoo bench run with ``args``, every configuration's child being ``child``: the rows
    of its one record, and the seconds it took."""
    parent, record, _ = zoo_parent(tmp_path, child, *args)
    t0 = time.time()
    p = subprocess.run([sys.executable, str(parent)], capture_output=True, text=True, timeout=120)
    took = time.time() - t0
    assert p.returncode == 0, p.stderr
    (rec,) = [json.loads(x) for x in record.read_text().splitlines()]
    return rec["results"], took


def test_the_zoo_budget_bounds_the_whole_run(tmp_path):
    """``--budget`` is the whole run's: the last configuration gets what is left of it, not
    a minute past it (an H100 run given 495 s ran on past 505 s, into the outer timeout)."""
    child = stepping_child(tmp_path)  # never ends by itself: only the timeout ends it
    (first, second), took = _zoo_rows(
        tmp_path, child, "--models", "resnet50", "unet", "--base-batch", "resnet50=4",
        "--base-batch", "unet=4", "--modes", "lms", "--scales", "1.5", "--timeout", "600",
        "--budget", "25")
    assert took < 25 + 15, took  # the budget, and the interpreter's start and the record
    assert first["status"].startswith("timeout"), first
    assert first.get("cut_by_budget") is True, first  # the budget, not --timeout, cut it
    assert second["status"].startswith("not run (time budget"), second


def test_the_zoo_starts_no_configuration_the_budget_cannot_cover(tmp_path):
    """A configuration is not started when less of the budget is left than the longest one
    this run has finished took: it would be cut and record nothing (one started with 25 s
    left, needing about 170 s, spent a device call's last 25 s)."""
    child = tmp_path / "child.py"
    child.write_text("import json, time\ntime.sleep(25)\n"
                     "print('RESULT ' + json.dumps({'status': 'ok', 'units_per_s': 1.0, "
                     "'unit': 'img/s', 'step_s': 1.0, 'timed_steps': 1, 'timed_alloc_retries': 0, "
                     "'peak_alloc': 1 << 30, 'peak_reserved': 1 << 30}), flush=True)\n")
    (first, second), took = _zoo_rows(
        tmp_path, child, "--models", "resnet50", "unet", "--base-batch", "resnet50=4",
        "--base-batch", "unet=4", "--modes", "stock", "--scales", "1.0", "--timeout", "600",
        "--budget", "50")
    assert first["status"] == "ok", first
    # its limit was the budget's 50 s, not --timeout's 600, but it finished: it was not cut
    assert "cut_by_budget" not in first, first
    # more than the 20 s floor was left (the first one's start and end take well under 5 s),
    # less than the first one took
    assert second["status"].startswith("not run (time budget: 2"), second
    assert "the longest configuration so far took 2" in second["status"], second
    assert took < 25 + 15, took  # the second child was never started


def test_the_budget_refuses_what_the_longest_finished_one_says_cannot_fit():
    """Only a finished configuration's wall time is an estimate (a cut one's is its limit);
    before any has finished, the floor alone decides."""
    budget = import_bench("budget").Budget(100.0, floor=20.0)
    assert budget.refusal() is None
    budget.finished({"status": "timeout (300 s)", "wall_s": 300.0})
    assert budget.refusal() is None and budget.longest == 0.0
    budget.finished({"status": "ok", "wall_s": 60.0})
    assert budget.refusal() is None  # about 100 s left
    budget.finished({"status": "ok", "wall_s": 150.0})
    refused = budget.refusal()
    assert refused and refused.startswith("not run (time budget: "), refused
    assert refused.endswith("the longest configuration so far took 150 s)"), refused
    assert import_bench("budget").Budget(10.0, floor=20.0).refusal()  # under the floor


def test_the_distributed_run_starts_no_job_the_budget_cannot_cover(tmp_path, monkeypatch):
    """bench_distributed.py keeps the zoo's and the loops' budget rule: each job's limit is at
    most what is left of the run's budget, and no job starts once the longest finished one
    says it cannot fit (jobs of 10 s and then 150 s against a 100 s budget)."""
    bench = import_bench("bench_distributed")
    limits, walls = [], iter([10.0, 150.0])

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        if "--probe" in argv:
            return {"status": "ok", "results": [], "wall_s": 0.1}
        limits.append(timeout)
        batch = int(argv[argv.index("--batch") + 1])
        rank = {"rank": 0, "status": "ok", "step_s": 1.0, "units_per_s": 10.0, "unit": "img/s",
                "batch": batch, "lms": "--no-lms" not in argv, "steps": 3}
        return {"status": "ok", "returncode": 0, "results": [rank], "wall_s": next(walls)}

    monkeypatch.setattr(bench, "run_process", fake_run)
    monkeypatch.setattr(sys, "argv", ["bench_distributed.py", "--gpus", "1", "--engines", "ddp",
                                      "--base-batch", "4", "--timeout", "240", "--budget", "100",
                                      "--out", str(tmp_path / "out"),
                                      "--record", str(tmp_path / "r.jsonl"),
                                      "--table", str(tmp_path / "t.md")])
    assert bench.main() == 0
    (rec,) = [json.loads(x) for x in open(tmp_path / "r.jsonl")]
    status = [r["status"] for r in rec["rows"]]
    assert status[:2] == ["ok", "ok"], status
    assert len(status) > 2 and all(x.startswith("not run (time budget: ") for x in status[2:]), status
    assert "the longest configuration so far took 150 s" in status[2], status
    assert len(limits) == 2 and all(t <= 100 for t in limits), limits
    # the budget set both jobs' limits, but both finished: neither was cut by it
    assert not any("cut_by_budget" in r for r in rec["rows"][:2]), rec["rows"][:2]


def test_the_zoo_runs_swapping_modes_only_at_their_scales(tmp_path):
    """``--lms-scales`` keeps the swapping modes to their scales: stock runs at 1.0x for the
    bound, the swapping mode at 1.5x and 2.0x only, not at 1.0x too (each configuration of a
    model at 1.0x costs a device call half a minute or more)."""
    child = tmp_path / "child.py"
    child.write_text("raise SystemExit(3)\n")  # every configuration fails at once
    results, _ = _zoo_rows(
        tmp_path, child, "--models", "resnet50", "--base-batch", "resnet50=4", "--modes",
        "stock", "lms", "--scales", "1.0", "1.5", "2.0", "--lms-scales", "1.5", "2.0",
        "--baseline-scales", "1.0")
    rows = [(r["scale"], r["mode"]) for r in results]
    assert rows == [(1.0, "stock"), (1.5, "lms"), (2.0, "lms")], results


def test_bounds_at_facts_rates_and_at_the_probed_link(tmp_path):
    """The bound of an lms row: max(compute, copy term) with stock's 1.0x rate, the copy
    term alone without it (marked), and the same at this host's measured link rates."""
    import argparse
    bench = import_bench("bench_lms_swap")
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


def test_a_run_cut_after_its_result_keeps_it_and_one_cut_before_does_not(tmp_path):
    """Both benches: a child that printed its result and was then cut by the timeout (while
    exiting) is that result, marked (and said so in the zoo's table); one cut before printing
    it stays a timeout."""
    children, zoo_report = import_bench("children"), import_bench("zoo_report")
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
    bench = import_bench("bench_loops")
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
    bench = import_bench("bench_loops")
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
    bench = import_bench("bench_loops")
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
    bench = import_bench("bench_loops")
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
    bench = import_bench("bench_loops")
    records = import_bench("records")

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        if "--compile" in argv:
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
    bench = import_bench("bench_loops")
    argvs = []

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        argvs.append(argv)
        if "--compile" in argv:
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
    assert argvs[0][-2:] == ["--compile", "net"] and not any("--compile" in a for a in argvs[1:])
    assert rows[0]["net_compile"] == {"net": "unavailable", "reason": "RuntimeError: no CUDA"}
    assert argvs[3][-4:] == ["--lms-option", "prefetch_past_peak=0",
                             "--lms-option", "prefetch_depth=8"]
    assert "--lms-option" not in argvs[2]
    for bad in ("prefetch_past_peak", "=1", ""):
        monkeypatch.setattr(sys, "argv", common + ["--lms-variant", bad])
        with pytest.raises(SystemExit):
            bench.main()
    assert len(argvs) == 4


def test_what_the_modes_load_is_compiled_once_before_them(tmp_path, monkeypatch):
    """The pluggable modes get the allocator compiled before any configuration, the layer's
    modes the net, each once, outside every configuration's time limit; each row keeps what
    the compile answered, and --compile-s 0 leaves it to the first configuration."""
    bench = import_bench("bench_loops")
    argvs = []

    def fake_run(argv, timeout, guard, log, env, on_result=None):
        argvs.append(argv)
        if "--compile" in argv:
            what = argv[argv.index("--compile") + 1]
            return {"status": "ok", what: "ready", "s": 2.0}
        r = {"status": "ok", "steps_done": 2, "unit": "tok/s",
             "steps": [{"i": i, "units": 100, "s": 1.0, "timed": i == 1} for i in range(2)]}
        on_result(r)
        return r

    monkeypatch.setattr(bench, "run_process", fake_run)
    common = ["bench_loops.py", "--loops", "ckpt-some", "--base-batch", "ckpt-some=24",
              "--scales", "1.0", "1.5", "--lms-scales", "1.5", "--table", str(tmp_path / "t.md")]
    for modes, want in ((["stock", "pluggable"], ["allocator"]),
                        (["lms", "pluggable+lms"], ["net", "allocator"]),
                        (["stock", "lms"], ["net"])):
        argvs.clear()
        rec = tmp_path / f"{'-'.join(modes)}.jsonl"
        monkeypatch.setattr(sys, "argv", common + ["--modes", *modes, "--record", str(rec)])
        bench.main()
        compiles = [a[a.index("--compile") + 1] for a in argvs if "--compile" in a]
        assert compiles == want, (modes, compiles)
        assert all("--compile" in a for a in argvs[:len(want)]), argvs  # before every run
        rows = [json.loads(x) for x in open(rec)]
        assert all(r[f"{w}_compile"] == {w: "ready", "s": 2.0} for r in rows for w in want)
    argvs.clear()
    monkeypatch.setattr(sys, "argv", common + ["--modes", "pluggable", "--compile-s", "0",
                                               "--record", str(tmp_path / "none.jsonl")])
    bench.main()
    assert not any("--compile" in a for a in argvs), argvs


def test_a_loops_row_names_the_tunables_it_ran_with(tmp_path):
    """Two lms rows of one run that differ only in an lms_swap tunable (--lms-option) are
    told apart in the table: the options stand beside the mode."""
    bench = import_bench("bench_loops")
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
    bench = import_bench("bench_loops")

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
    cap = import_bench("device_cap")
    records = import_bench("records")
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


def test_how_a_card_is_held_reaches_the_children_and_the_record(tmp_path, monkeypatch):
    """--device-hold: 'fraction' unless asked, a bad hold refused at the command line and
    in a child's environment, and a run held by a ballast says so in its record and table
    (a held card by PyTorch's fraction is stricter near its edge than the real card)."""
    cap = import_bench("device_cap")
    records = import_bench("records")
    p = subprocess.run([sys.executable, str(BENCH / "bench_loops.py"), "--device-hold",
                        "sandbag", "--table-only"], capture_output=True, text=True)
    assert p.returncode == 2 and "--device-hold" in p.stderr, p.stderr
    with pytest.raises(ValueError):
        cap.pass_to_children(40.0, "sandbag")
    for env in (cap.ENV, cap.HOLD_ENV):  # what pass_to_children writes goes at teardown
        monkeypatch.setenv(env, "")
        monkeypatch.delenv(env)
    with pytest.raises(SystemExit) as e:  # a hold with no size to hold to
        cap.pass_to_children(None, "ballast")
    assert "--device-gib" in str(e.value)
    cap.pass_to_children(None)  # nothing asked: nothing held, nothing passed
    assert cap.HOLD_ENV not in os.environ and cap.hold() == "fraction"
    cap.pass_to_children(cap.parse("h100"))
    assert os.environ[cap.HOLD_ENV] == "fraction" and records.machine()["device_hold"] == "fraction"
    cap.pass_to_children(cap.parse("h100"), "ballast")
    m = dict(records.machine(), gpu="NVIDIA H200, 580.159.04")
    assert m["device_hold"] == "ballast", m
    assert records.gpu_label(m) == ("NVIDIA H200, 580.159.04, held to 79.2 GiB (an H100's "
                                    "size) by a ballast")
    monkeypatch.setenv(cap.HOLD_ENV, "sandbag")
    with pytest.raises(SystemExit) as e:
        cap.hold()
    assert "sandbag" in str(e.value)
