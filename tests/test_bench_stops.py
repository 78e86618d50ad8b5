"""The benchmark harness (examples/pytorch/benchmarks/) stopped from outside, on CPU.

Each configuration runs in a child process in its own session, so a signal sent to the
parent does not reach the child by itself.  A child left running keeps its GPU memory,
and the next configuration then runs out of memory for a reason that is not its own
(seen on the H100).  These tests run real processes: the parent is stopped the way an
outer ``timeout`` or Ctrl-C stops it, and the child must be gone afterwards, its record
written.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bench_fixtures import BENCH, alive, bench_parent, import_bench, stepping_child, zoo_parent

pytest.importorskip("torch")  # bench_lms_swap imports the zoo, which imports torch


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
    assert alive(child_pid)
    p.send_signal(sig)
    assert p.wait(timeout=30) == 128 + sig
    deadline = time.time() + 10
    while alive(child_pid) and time.time() < deadline:
        time.sleep(0.1)
    left = alive(child_pid)
    if left:
        os.kill(child_pid, signal.SIGKILL)
    assert not left, "the child outlived its parent"


def test_a_parent_stopped_mid_run_leaves_the_runs_record_of_what_it_did(tmp_path):
    """An outer timeout stops the loops bench while a configuration runs: the child is
    ended, and the parent still has the steps it printed, under a status that says it
    was stopped, to record before it exits with 128 + the signal."""
    child = stepping_child(tmp_path)
    out = tmp_path / "record.json"
    parent = bench_parent(tmp_path, f"""
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
    child = stepping_child(tmp_path, f"""
        if os.fork() == 0:  # leaves the child's process group, keeps its output open
            os.setsid()
            open({str(holder)!r}, "w").write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
    """)
    out = tmp_path / "record.json"
    parent = bench_parent(tmp_path, f"""
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


def _started(tmp_path):
    """The file a stand-in configuration child writes first, to say it has started."""
    return tmp_path / "child.started"


def _zoo_stopped_after(tmp_path, child, seconds):
    """The zoo bench over one lms configuration whose child is ``child``, stopped as an outer
    timeout stops it (SIGTERM) ``seconds`` after the child wrote ``_started`` (not after a
    fixed time from the parent's start: on a loaded machine the parent's imports alone can
    take seconds): its record and table files."""
    parent, record, table = zoo_parent(tmp_path, child, "--models", "resnet50", "--base-batch",
                                        "resnet50=4", "--modes", "lms", "--scales", "1.5")
    p = subprocess.Popen([sys.executable, str(parent)], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not _started(tmp_path).exists():
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline, "the configuration's child never started"
        time.sleep(0.05)
    time.sleep(seconds)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM, p.stderr.read().decode()
    return record, table


def test_a_zoo_run_stopped_mid_configuration_still_writes_its_record(tmp_path):
    """The zoo bench writes one record per run, at its end.  An outer timeout that stops it
    while a configuration runs must still leave that record: the configurations before, and
    the one it cut with the steps it printed (an H100 run cut this way left none)."""
    # stands in for every configuration
    child = stepping_child(tmp_path, f"open({str(_started(tmp_path))!r}, 'w').close()\n")
    record, table = _zoo_stopped_after(tmp_path, child, 2)
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


def test_a_job_s_grandchildren_and_garbled_records(tmp_path):
    """A torchrun job's workers are the child's children: they end with it.  Its ranks'
    RESULT lines are all kept; a garbled one is skipped, not fatal to the parent."""
    children = import_bench("children")
    pidfile = tmp_path / "grandchild.pid"
    script = (f"sleep 120 & echo $! > {pidfile}; "
              "echo 'RESULT {\"rank\": 0}'; echo 'RESULT {garbled'; echo 'RESULT {\"rank\": 1}'")
    log = open(tmp_path / "log.txt", "w", buffering=1)
    r = children.run_process(["bash", "-c", script], 60, 0, log)
    assert r["results"] == [{"rank": 0}, {"rank": 1}] and r["rank"] == 1
    assert "RESULT {garbled" in (tmp_path / "log.txt").read_text()
    deadline = time.time() + 10
    while alive(int(pidfile.read_text())) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(int(pidfile.read_text()))


def test_a_stop_while_a_finished_child_exits_keeps_its_result(tmp_path):
    """A child that printed its result and is still exiting (one that pinned tens of GB of
    host memory takes seconds) when the bench is stopped: its row is recorded with the
    result it printed, not as cut."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        import json, time
        open({str(_started(tmp_path))!r}, "w").close()
        print("RESULT " + json.dumps({{
            "model": "resnet50", "mode": "lms", "batch": 6, "status": "ok",
            "units_per_s": 12.5, "unit": "img/s", "step_s": 0.48, "timed_steps": 14,
            "timed_alloc_retries": 0, "out_bytes_per_step": 2e9, "in_bytes_per_step": 2e9,
            "peak_alloc": 1 << 30, "peak_reserved": 1 << 30}}), flush=True)
        time.sleep(60)  # its exit, slow
    """))
    record, table = _zoo_stopped_after(tmp_path, child, 2)
    lines = record.read_text().splitlines()
    assert len(lines) == 1, lines
    (res,) = __import__("json").loads(lines[0])["results"]
    assert res["status"] == "ok" and res["units_per_s"] == 12.5, res
    assert res["stopped_after_result"].startswith("stopped with the benchmark"), res
    assert abs(res["frac_of_bound"] - (2e9 / 54e9 + 2e9 / 53e9) / 0.48) < 1e-6, res
