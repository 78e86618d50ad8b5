"""TensorFlow v2.14.1 BFC allocator with Large Model Support, on the CPU (CI).

The LMS tree (tag + edit series + patches/tensorflow/src, the lms_tree fixture)
is compiled without a TensorFlow build: its allocator translation units are
built against the official tensorflow-cpu 2.14.1 wheel's headers and linked
with its libtensorflow_framework.so.2 (downloaded once into .cache/), together
with TensorFlow's own BFC allocator tests and the LMS conformance tests
(build_tools/verify/tf_allocator).  On the CPU the page backend maps memfd
"device" and "host" pages with mmap(MAP_FIXED): same pointer-stability and
budget semantics as the CUDA VMM backend (tests/conformance/
tensorflow_allocator runs the same program on a GPU).

Also: the Python edits work on stock tensorflow-cpu 2.14.1 (the C++ wiring is
compiled and linked in tests/test_tf_wiring_check.py).

Needs: g++, Debian libgtest-dev + libgmock-dev, protoc (all from `make setup`);
network once (pip download of the wheel; the Python check also pip-installs it
into .cache/tf-venv).
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from build_tools.verify import tf_allocator as tab
from build_tools.tools import find_tool
from build_tools.verify.tf_allocator import LMS_TESTS, WRITERS_TEST as WRITERS, python_overlay
from tests.wheel_pythons import python_for

REPO = Path(__file__).resolve().parent.parent
TAG = "v2.14.1"

CPU_OUT = REPO / "build" / "tf_allocator" / "cpu-ci"
# Tests of lms_failure_test.cc checked here by name besides LMS_TESTS: several devices in one
# process (two simulated devices on the CPU) and the quiesce bound's setting.
MULTI_DEVICE = "LmsMultiDevice.TwoDevicesMoveWhileEachWritesTheOthersMemory"
QUIESCE_SETTING = "LmsFailure.QuiesceWaitSettingBoundedAndChecked"


def _require_toolchain():
    missing = [p for p in ("/usr/include/gtest/gtest.h", "/usr/include/gmock/gmock.h",
                           "/usr/lib/x86_64-linux-gnu/libgtest.a") if not Path(p).exists()]
    if missing or not find_tool("g++"):
        pytest.fail("the allocator build needs g++ and Debian's libgtest-dev + libgmock-dev "
                    f"(missing: {missing or 'g++'})")


@pytest.fixture(scope="module")
def tree(lms_tree):
    return lms_tree("tensorflow", TAG)


def test_upstream_bfc_test_adaptation_keeps_every_test(upstream_tree):
    src = (upstream_tree("tensorflow", TAG) / tab.UPSTREAM_TEST).read_text()
    adapted = tab.adapt_upstream_test(src)
    for macro in ("TEST_P(", "TEST_F(", "INSTANTIATE_TEST_SUITE_P("):
        assert adapted.count(macro) == src.count(macro), macro
    assert "BM_Allocation" not in adapted and "stream_executor::" not in adapted
    assert "lms_test::VmmSubAllocator" in adapted


def test_an_object_is_recompiled_when_a_header_it_includes_changes(tmp_path):
    """The build's up-to-date check covers the headers an object's last compilation read,
    not only its source and command (a changed test-support header once left a stale
    object that no longer linked)."""
    _require_toolchain()
    (tmp_path / "a.h").write_text("inline int f() { return 1; }\n")
    src = tmp_path / "a.cc"
    src.write_text('#include "a.h"\nint g() { return f(); }\n')
    obj = tmp_path / "a.o"
    job = ([find_tool("g++"), "-c", str(src), "-o", str(obj)], src, obj)
    assert tab.compile_job(job) == "compiled a.cc"
    assert tab.compile_job(job) == "up to date a.o"
    (tmp_path / "a.h").write_text("inline int f() { return 2; }\n")
    assert tab.compile_job(job) == "compiled a.cc"
    assert tab.compile_job(job) == "up to date a.o"


def test_allocator_conformance_cpu(tree, tmp_path):
    """Upstream BFC tests + LMS conformance, built from the LMS tree only."""
    _require_toolchain()
    binary = tab.build(tree, "cpu", out=CPU_OUT, overlay_src=None)
    xml = tmp_path / "gtest.xml"
    r = subprocess.run([str(binary), f"--gtest_output=xml:{xml}"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=900)
    summary = "\n".join([l for l in r.stdout.splitlines() if l.startswith("[")][-60:])
    assert r.returncode == 0, summary
    res = tab.gtest_results(xml)
    upstream = [n for n in res if n.startswith("GPUBFCAllocator") and ".DISABLED_" not in n]
    # TensorFlow's own tests (25 on v2.14.1; parameterized ones on both
    # sub-allocator kinds: plain and page-mapped).
    assert len(upstream) >= 25, sorted(res)
    for name in upstream + list(LMS_TESTS) + [MULTI_DEVICE, QUIESCE_SETTING]:
        assert res.get(name) in ("completed", "run"), (name, res.get(name), summary)
    # The messages users see.
    assert "TF_GPU_HOST_MEM_LIMIT_IN_MB=" in r.stdout
    assert "tf.config.experimental.set_lms_defrag_enabled(True)" in r.stdout
    # the writers test ran with the (stand-in) launch gate, which held writers' passes
    assert "launch gate on)" in r.stdout
    m = re.search(r"writers: \d+ rounds of pressure\n(?:.*\n)*?Launch gate calls held: (\d+)", r.stdout)
    assert m and int(m.group(1)) > 0, summary


def test_two_devices_move_without_hanging_on_a_collective(tree):
    """Two (simulated) devices move pages while each one's kernels add to the other's tensors and
    a handshake pair of kernels (a collective's, the second launched late) waits across them. A
    move holds every launch and drains both devices: a round that catches the first handshake
    kernel waiting for its held partner is given up within its bound and started over (counted),
    and no add is lost. With the bound longer than the test's watchdog
    (TF_LMS_QUIESCE_WAIT_MS=60000), as an unbounded wait is, the same run hangs: the watchdog fails
    it."""
    _require_toolchain()
    binary = tab.build(tree, "cpu", out=CPU_OUT, overlay_src=None)

    def run(**env):
        return subprocess.run([str(binary), f"--gtest_filter={MULTI_DEVICE}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300, env={**os.environ, "LMS_TEST_RACE_SECONDS": "4", **env})
    bounded = run(LMS_TEST_WATCHDOG_SECONDS="120")
    assert bounded.returncode == 0 and f"[       OK ] {MULTI_DEVICE}" in bounded.stdout, \
        bounded.stdout[-3000:]
    given_up = [int(n) for n in re.findall(r"Quiesce rounds given up: (\d+)", bounded.stdout)]
    assert len(given_up) == 2 and max(given_up) > 0, bounded.stdout[-3000:]
    unbounded = run(TF_LMS_QUIESCE_WAIT_MS="60000", LMS_TEST_WATCHDOG_SECONDS="8")
    assert unbounded.returncode == 3, unbounded.stdout[-3000:]
    assert f"watchdog: {MULTI_DEVICE.split('.')[1]} did not finish within 8 s" in unbounded.stdout


def test_writers_test_catches_page_moves_without_the_gate(tree):
    """The writers test is a real check: with the gate off (TF_LMS_LAUNCH_GATE=0) it is skipped,
    naming the reason; run anyway (LMS_TEST_RACE_WITHOUT_GATE=1) LMS fails closed (the pressure's
    allocations are refused, saying the gate is inactive, and no write is lost); and with the
    documented unsafe opt-in (TF_LMS_UNSAFE_MOVE_WITHOUT_GATE=1) it fails, the writers'
    increments lost while LMS moves their blocks' pages."""
    _require_toolchain()
    binary = tab.build(tree, "cpu", out=CPU_OUT, overlay_src=None)

    def run(**env):
        return subprocess.run([str(binary), f"--gtest_filter={WRITERS}"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300,
                              env={**os.environ, "TF_LMS_LAUNCH_GATE": "0",
                                   "LMS_TEST_RACE_SECONDS": "2", **env})
    skipped = run()
    assert skipped.returncode == 0 and f"[  SKIPPED ] {WRITERS}" in skipped.stdout, skipped.stdout[-3000:]
    assert "launch gate inactive (reason 4" in skipped.stdout
    closed = run(LMS_TEST_RACE_WITHOUT_GATE="1")
    assert closed.returncode != 0 and f"[  FAILED  ] {WRITERS}" in closed.stdout, closed.stdout[-3000:]
    assert "launch gate is inactive (reason 4" in closed.stdout, closed.stdout[-3000:]
    assert "CountMismatchesAdd" not in closed.stdout, closed.stdout[-3000:]
    raced = run(LMS_TEST_RACE_WITHOUT_GATE="1", TF_LMS_UNSAFE_MOVE_WITHOUT_GATE="1")
    assert raced.returncode != 0 and f"[  FAILED  ] {WRITERS}" in raced.stdout, raced.stdout[-3000:]
    assert "rounds of pressure" in raced.stdout and "CountMismatchesAdd" in raced.stdout


# The config.proto edit and the C++ GPU wiring (gpu_process_state.cc, gpu_lms_*.cc, tfe_wrapper.cc,
# ...) are compiled into object files against the tensorflow==2.14.1 GPU wheel and linked short of
# the binary in tests/test_tf_wiring_check.py (build_tools/verify/tf_wiring), which replaced the
# -fsyntax-only check that stood here.


CHECK = textwrap.dedent("""
    import tensorflow as tf
    from tensorflow.python.framework import config
    from tensorflow.python.eager import context
    from tensorflow.core.protobuf import config_pb2
    assert tf.__version__ == "2.14.1", tf.__version__
    assert config.__file__.startswith(OVERLAY), config.__file__
    # Unset: the ConfigProto carries no LMS fields.
    opts = context.context()._compute_gpu_options()
    assert not opts.experimental.lms_enabled and "lms" not in str(opts), opts
    assert config.get_lms_enabled() is False and config.get_lms_defrag_enabled() is False
    config.set_lms_enabled(True)
    config.set_lms_defrag_enabled(True)
    assert config.get_lms_enabled() and config.get_lms_defrag_enabled()
    gpu = context.context().config.gpu_options
    assert gpu.experimental.lms_enabled and gpu.experimental.lms_defrag_enabled, gpu
    cp = config_pb2.ConfigProto()
    cp.gpu_options.experimental.lms_enabled = True
    back = config_pb2.ConfigProto.FromString(cp.SerializeToString())
    assert back.gpu_options.experimental.lms_enabled
    tf.reduce_sum(tf.ones([4]))          # the context is initialized now
    config.set_lms_enabled(True)         # no change: fine
    try:
        config.set_lms_enabled(False)
        raise SystemExit("changing LMS after initialization must fail")
    except RuntimeError as e:
        assert "before the GPU devices are initialized" in str(e)
    try:
        config.get_memory_stats("CPU:0")
        raise SystemExit("stock TF has no TFE_GetMemoryStats")
    except NotImplementedError as e:
        assert "not a Large Model Support build" in str(e)
    print("LMS python API OK")
""")


def test_python_api_on_stock_tensorflow(tree, tmp_path):
    """config.py/context.py of the LMS tree + config_pb2 regenerated from its
    config.proto, imported into stock tensorflow-cpu 2.14.1."""
    py = python_overlay.ensure_tf_python(python=python_for("tensorflow-cpu", "2.14.1"))
    site = python_overlay.make_overlay(tree, tmp_path / "overlay", py)
    r = subprocess.run([str(py), "-c", f"OVERLAY = {str(site)!r}\n" + CHECK],
                       env={**os.environ, "PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2"},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0 and "LMS python API OK" in r.stdout, r.stdout[-4000:]
