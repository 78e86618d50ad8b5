"""tests/wheel_pythons.py: which interpreter runs the tests of framework wheels published only for
older Pythons (torch 1.13.1, tensorflow-cpu 2.14.1), and the one skip reason where none exists."""
from __future__ import annotations

import re
import sys

import pytest

from tests import wheel_pythons as wp


def test_the_running_python_when_it_has_a_wheel(monkeypatch):
    monkeypatch.setattr(wp, "RUNNING", "3.11")
    assert wp.find_python("torch", "1.13.1", path="/nonexistent") == sys.executable


def test_another_python_on_path_else_the_no_wheel_skip(monkeypatch, tmp_path):
    monkeypatch.setattr(wp, "RUNNING", "3.13")
    assert wp.find_python("tensorflow-cpu", "2.14.1", path=str(tmp_path)) is None
    fake = tmp_path / "python3.10"  # answers as a Python 3.10 with venv and ensurepip would
    fake.write_text("#!/bin/sh\necho 3.10\n")
    fake.chmod(0o755)
    assert wp.find_python("tensorflow-cpu", "2.14.1", path=str(tmp_path)) == str(fake)
    monkeypatch.setattr(wp, "find_python", lambda *a, **k: None)
    with pytest.raises(pytest.skip.Exception) as e:
        wp.python_for("torch", "1.13.1")
    assert str(e.value.msg) == "no torch 1.13.1 wheel for Python 3.13"
    assert re.match(wp.NO_WHEEL_PATTERN, e.value.msg)
