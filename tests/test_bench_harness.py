"""The benchmark harness (examples/pytorch/benchmarks/bench_lms_swap.py) on CPU.

Each configuration runs in a child process in its own session, so a signal sent to the
parent does not reach the child by itself.  A child left running keeps its GPU memory,
and the next configuration then runs out of memory for a reason that is not its own
(seen on the H100).  These tests run real processes: the parent is stopped the way an
outer ``timeout`` or Ctrl-C stops it, and the child must be gone afterwards.
"""
from __future__ import annotations

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

