"""The TensorFlow examples run (tiny sizes, CPU) on stock tensorflow-cpu 2.14.1.

They run in the TensorFlow venv of build_tools.verify.tf_allocator
(.cache/tf-venv, made from the cached wheel: TF 2.14 needs numpy < 2, so it is
kept apart from the project's Python).  On a stock TensorFlow the LMS switches
must say clearly that this is not an LMS build, and training must go on.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from build_tools.verify.tf_allocator import python_overlay
from tests.wheel_pythons import python_for

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "tensorflow"
NOT_LMS = "is not a Large Model Support build"


@pytest.fixture(scope="module")
def tf_python():
    return python_overlay.ensure_tf_python(python=python_for("tensorflow-cpu", "2.14.1"))


def _run(py, *args, timeout=600, onednn="0"):
    # Stock TensorFlow keeps CPU allocator statistics only with its oneDNN CPU path, which it turns
    # on by itself on some CPUs: each test says which it wants, so no outcome depends on the CPU.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "TF_ENABLE_ONEDNN_OPTS": onednn}
    r = subprocess.run([str(py), *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return r.returncode, r.stdout


def test_manymodel_tiny_with_lms_switches_stats_and_profile(tf_python, tmp_path):
    rc, out = _run(tf_python, EXAMPLES / "ManyModel.py", "-m", "ResNet50", "--image-size", 32,
                   "--batch-size", 2, "--steps", 3, "--epochs", 2, "--lms", "--lms-defrag",
                   "--stats", 1, "--stats-json", tmp_path / "stats.json",
                   "--profile", tmp_path / "prof")
    assert rc == 0, out[-3000:]
    assert NOT_LMS in out and "LMS switches are ignored" in out, out
    assert "LMS build: False, LMS on: False" in out
    assert "RESULT ResNet50 32 2 " in out, out
    assert "no allocator statistics for CPU:0" in out, out
    rec = json.loads((tmp_path / "stats.json").read_text())
    assert rec["lms_build"] is False and rec["device"] == "CPU:0"
    assert list((tmp_path / "prof").rglob("*.xplane.pb")), "no profile written"


def test_manymodel_other_model_without_lms(tf_python):
    rc, out = _run(tf_python, EXAMPLES / "ManyModel.py", "-m", "MobileNetV2", "--image-size", 32,
                   "--batch-size", 2, "--steps", 2, "--epochs", 1, "--num-classes", 10)
    assert rc == 0, out[-3000:]
    assert NOT_LMS not in out  # no LMS switch given: nothing to complain about
    assert "RESULT MobileNetV2 32 2 " in out, out


def test_stats_callback_example(tf_python, tmp_path):
    rc, out = _run(tf_python, EXAMPLES / "lms_stats_callback.py", "--image-size", 16,
                   "--batch-size", 2, "--steps", 2, "--epochs", 1, "--lms",
                   "--json", tmp_path / "s.json")
    assert rc == 0, out[-3000:]
    assert NOT_LMS in out and "stock TensorFlow" in out, out
    assert json.loads((tmp_path / "s.json").read_text())["lms_build"] is False


def test_stats_callback_with_cpu_allocator_statistics(tf_python, tmp_path):
    """With oneDNN on, stock TensorFlow reports current/peak bytes for CPU:0 (get_memory_info): the
    callback records and prints them."""
    rc, out = _run(tf_python, EXAMPLES / "lms_stats_callback.py", "--image-size", 16,
                   "--batch-size", 2, "--steps", 2, "--epochs", 1,
                   "--json", tmp_path / "s.json", onednn="1")
    assert rc == 0, out[-3000:]
    assert "[stats] epoch 0 on CPU:0: bytes_in_use=" in out and "MiB" in out, out
    records = json.loads((tmp_path / "s.json").read_text())["records"]
    assert records and all(r["source"] == "get_memory_info" for r in records), records
