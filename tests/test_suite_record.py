"""--suite-record (tests/suite_record.py): a run of pytest appends one JSON line with every
test's outcome, the machine, the commit and what the suite wrote, and refuses a bad field
before anything runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = '''
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_skips():
    pytest.skip("no torch 1.13.1 wheel for Python 3.13")

def test_left_out():
    pass
'''


def run(tmp_path, *args):
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                          "from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "LMS_CONFORMANCE_REPORT"}
    env.update(LMS_RUN="77", LMS_COMMIT="abc1234")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py"), *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_a_run_appends_one_line_with_every_outcome_and_the_suites_files(tmp_path):
    data = tmp_path / "results"
    data.mkdir()
    (data / "bandwidth.json").write_text(json.dumps({"out_gbps": 48.9}))
    (data / "broken.json").write_text("{not json")
    rec = tmp_path / "out" / "suite.jsonl"
    args = ("-k", "not left_out", "--suite-record", str(rec), "--suite-record-data", str(data),
            "--suite-record-field", "tag=v2.6.0")
    rc, out = run(tmp_path, *args)
    assert rc == 1, out
    rc, out = run(tmp_path, *args)  # a second run appends
    lines = rec.read_text().splitlines()
    assert len(lines) == 2, lines
    r = json.loads(lines[-1])
    assert (r["run"], r["commit"], r["tag"]) == ("77", "abc1234", "v2.6.0"), r
    assert r["pytest"]["passed"] == ["test_passes"] and r["pytest"]["failed"] == ["test_fails"], r
    assert r["pytest"]["skipped"] == {"test_skips": "no torch 1.13.1 wheel for Python 3.13"}, r
    assert r["pytest"]["deselected"] == ["test_left_out"] and r["pytest"]["exit"] == 1, r
    assert r["pytest"]["line"].startswith("1 failed, 1 passed, 1 skipped, 1 deselected in "), r
    assert r["tests"] == {"bandwidth": {"out_gbps": 48.9}, "broken": {"unreadable": "broken.json"}}
    assert "--suite-record-field tag=v2.6.0" in r["command"] and "machine" in r, r


def test_without_the_option_nothing_is_written_and_a_bad_field_stops_before_the_tests(tmp_path):
    rc, out = run(tmp_path, "-k", "passes")
    assert rc == 0 and not list(tmp_path.glob("*.jsonl")), out
    rec = tmp_path / "suite.jsonl"
    rc, out = run(tmp_path, "--suite-record", str(rec), "--suite-record-field", "tag")
    assert rc == 4 and "--suite-record-field 'tag': expected KEY=VALUE" in out, out
    assert not rec.exists() and "test_passes" not in out, out


def test_the_allocator_tables_show_a_records_verdict():
    sys.path.insert(0, str(REPO / "examples" / "pytorch" / "benchmarks"))
    try:
        import record_tables
    finally:
        sys.path.pop(0)
    r = {"run": "158", "pytest": {"line": "4 passed, 1 failed in 130.00s", "failed": ["test_x"],
                                  "deselected": []}}
    assert record_tables.tf_rows([r]) == [["158", "pytest", "4 passed, 1 failed in 130.00s; "
                                           "failed: test_x", "-", "-"]]
    rows = record_tables.allocator_rows([{**r, "tests": {"bandwidth": {"ok": True}}}])
    assert rows[0][:2] == ["158", "bandwidth"] and rows[-1][:3] == ["158", "pytest",
                                                                    "4 passed, 1 failed in 130.00s"]
