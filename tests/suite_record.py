"""One JSON line per run of a GPU suite (the allocator conformance suites, the pluggable
allocator's tests), written by pytest itself, so that a suite's record is never put together
by hand from its log:

    python -m pytest -m gpu tests/conformance/pytorch_allocator --suite-record OUT.jsonl \
        --suite-record-data $LMS_PT_RESULTS --suite-record-field tag=v2.6.0

The line starts as every benchmark record does (records.py's header: ``run`` and ``commit``
from ``LMS_RUN`` and ``LMS_COMMIT`` where set, else git's; date, machine, torch), then the
command and the suite's
verdict: every test passed, failed, skipped (with its reason), xfailed or deselected, and a
summary line.  ``--suite-record-data DIR``: the JSON files the suite wrote there go in as
``tests`` (by file stem), as the allocator tables (record_tables.py) read them.

tests/conftest.py collects the outcomes (the same ones its conformance report holds) and
calls :func:`write` at the end of the session."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["add_options", "check", "write"]


def add_options(parser) -> None:
    group = parser.getgroup("suite record")
    group.addoption("--suite-record", metavar="PATH", default=None,
                    help="append one JSON line for this run to PATH (every test's outcome, "
                         "machine, torch, commit; LMS_RUN and LMS_COMMIT where set)")
    group.addoption("--suite-record-data", metavar="DIR", default=None,
                    help="with --suite-record: the JSON files the suite wrote in DIR, by stem")
    group.addoption("--suite-record-field", metavar="KEY=VALUE", action="append", default=[],
                    help="with --suite-record: a field of the record (repeatable), e.g. tag=v2.6.0")


def check(config) -> None:
    """Refuses a bad --suite-record-field before the suite runs, not after it."""
    import pytest
    try:
        _fields(config.getoption("--suite-record-field"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def _fields(items: List[str]) -> Dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--suite-record-field {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _records():
    """examples/pytorch/benchmarks/records.py: the header (run, date, commit, machine, torch)
    and the append every benchmark record is written with."""
    bench = str(Path(__file__).resolve().parent.parent / "examples" / "pytorch" / "benchmarks")
    sys.path.insert(0, bench)
    try:
        import records
    finally:
        sys.path.remove(bench)
    return records


def _data(folder: Optional[str]) -> Optional[Dict[str, Any]]:
    if not folder or not Path(folder).is_dir():
        return None
    tests: Dict[str, Any] = {}
    for f in sorted(Path(folder).glob("*.json")):
        try:
            tests[f.stem] = json.loads(f.read_text())
        except ValueError:
            tests[f.stem] = {"unreadable": f.name}
    return tests


def write(config, results: List[dict], deselected: List[str], exitstatus: int,
          wall_s: float) -> None:
    """Appends the run's line to ``--suite-record`` (nothing where it is not given).
    ``results``: one dict per test as tests/conftest.py collects them (``test``, ``outcome``,
    ``reason``); ``deselected``: the node ids -k or -m dropped."""
    path = config.getoption("--suite-record")
    if not path:
        return

    def name(nodeid: str) -> str:
        return nodeid.split("::", 1)[-1]

    by = {k: [name(r["test"]) for r in results if r["outcome"] == k]
          for k in ("passed", "failed", "xfailed", "xpassed")}
    skipped = {name(r["test"]): r["reason"] for r in results if r["outcome"] == "skipped"}
    counts = [f"{len(v)} {k}" for k, v in (("failed", by["failed"]), ("passed", by["passed"]),
                                          ("skipped", skipped), ("deselected", deselected),
                                          ("xfailed", by["xfailed"]), ("xpassed", by["xpassed"]))
              if v]
    records = _records()
    rec: Dict[str, Any] = {
        **records.header(), **_fields(config.getoption("--suite-record-field")),
        "command": "python -m pytest " + shlex.join(map(str, config.invocation_params.args)),
        "pytest": {**by, "skipped": skipped, "deselected": [name(d) for d in deselected],
                   "exit": int(exitstatus),
                   "line": ", ".join(counts) + f" in {wall_s:.2f}s"},
    }
    tests = _data(config.getoption("--suite-record-data"))
    if tests is not None:
        rec["tests"] = tests
    records.append(path, rec)
