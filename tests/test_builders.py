"""Full-build plumbing that runs without a GPU toolchain: plans, toolchain checks, wheel versions."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from build_tools import toolchain
from build_tools.builders.plan import Plan, Step
from build_tools.builders.tensorflow_full import set_local_version
from build_tools.errors import LmsError
from build_tools.overlay.wheelzip import verify_record

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("version,spec,ok", [
    ("12.4", ">=11.8,<12.9", True), ("13.0", ">=11.8,<12.9", False), ("11.8", ">=11.8", True),
    ("3.11.7", ">=3.9,<3.12", True), ("3.12.0", ">=3.9,<3.12", False), ("6.1.0", "==6.1.0", True),
])
def test_version_ranges(version, spec, ok):
    assert toolchain.in_range(version, spec) is ok


def test_missing_tool_is_a_clear_error_saying_what_to_install(tmp_path):
    check = toolchain.tool_check("bazel-that-does-not-exist", exact="6.1.0", why="(pinned in .bazelversion)")
    plan = Plan("demo", [Step("never runs", ["false"])], [check], tmp_path / "log")
    with pytest.raises(LmsError) as err:
        plan.execute()
    text = str(err.value)
    assert "MISSING bazel-that-does-not-exist: not found" in text
    assert "install bazel-that-does-not-exist 6.1.0 (pinned in .bazelversion)" in text
    assert not (tmp_path / "log").exists(), "nothing runs when the toolchain is incomplete"


def test_failing_step_names_the_command_and_log(tmp_path):
    plan = Plan("demo", [Step("fails", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])], [],
                tmp_path / "build.log")
    with pytest.raises(LmsError) as err:
        plan.execute()
    assert "failed with exit status 3" in str(err.value) and "boom" in str(err.value)
    assert "boom" in (tmp_path / "build.log").read_text()


def test_local_version_rewrites_a_real_wheel(tmp_path):
    """A wheel built by pip (this project's own) gets +lms1 in its name, dist-info and METADATA, with a
    valid RECORD, and pip installs it as that version."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("lms_build_tools-*.whl"))
    out = tmp_path / "out"
    out.mkdir()
    new = set_local_version(wheel, "lms1", out)
    assert new.name.startswith("lms_build_tools-0.1.0+lms1-")
    assert verify_record(new) > 5
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(new)],
                   check=True, capture_output=True)
    meta = next(target.glob("lms_build_tools-0.1.0+lms1.dist-info")) / "METADATA"
    assert "Version: 0.1.0+lms1" in meta.read_text()
