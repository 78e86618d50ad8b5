"""Helpers of the benchmark harness's CPU tests (tests/test_bench_*.py): the benchmarks'
folder, stand-in children and parents that run the harness's real code as the benchmarks do,
and its modules imported from their folder."""
from __future__ import annotations

import os
import pathlib
import sys
import textwrap

__all__ = ["BENCH", "REPO", "alive", "bench_parent", "import_bench", "stepping_child",
           "zoo_parent"]

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "examples" / "pytorch" / "benchmarks"


def alive(pid: int) -> bool:
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


def stepping_child(tmp_path, before=""):
    """A child that runs ``before``, then prints a step every 0.1 s until killed."""
    child = tmp_path / "child.py"
    child.write_text("import json, os, time\n" + textwrap.dedent(before) + textwrap.dedent("""
        for i in range(10000):
            print("STEP " + json.dumps({"i": i, "s": 0.1}), flush=True)
            time.sleep(0.1)
    """))
    return child


def bench_parent(tmp_path, body):
    """A benchmark parent: the harness's children module, its stop handlers, then ``body``."""
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{str(BENCH)!r}]
        import children
        children.install_stop_handlers()
    """) + textwrap.dedent(body))
    return parent


def zoo_parent(tmp_path, child, *args):
    """A script that runs the zoo bench with ``args`` (besides its files under ``tmp_path``),
    every configuration's child being ``child``: the script, the record and the table."""
    record, table = tmp_path / "zoo.jsonl", tmp_path / "zoo.md"
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(BENCH)!r}, {str(BENCH.parent)!r}]
        import bench_lms_swap as bench
        bench.__dict__["__file__"] = {str(child)!r}  # run_child starts this file
        sys.argv = ["bench_lms_swap.py", *{list(args)!r}, "--link-probe-gib", "0", "--compile-s", "0",
                    "--out", {str(tmp_path / "out")!r}, "--record", {str(record)!r},
                    "--table", {str(table)!r}]
        sys.exit(bench.main())
    """))
    return parent, record, table


def import_bench(name):
    sys.path[:0] = [str(BENCH), str(BENCH.parent)]
    try:
        return __import__(name)
    finally:
        del sys.path[:2]
