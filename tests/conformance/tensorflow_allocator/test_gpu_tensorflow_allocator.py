"""GPU conformance of TensorFlow's BFC allocator with Large Model Support.

Runs the standalone allocator program built for CUDA (VMM page backend: device
pages and host-NUMA pages remapped at the same virtual addresses; patterns
written and checked by GPU kernels).  Build it on the CPU machine and take it
along (the GPU machine has no TensorFlow wheel and no internet):

    python -m build_tools.verify.tf_allocator --tree <LMS v2.14.1 tree> \\
        --target cuda --bundle .device/tf

then run with ``carry=[".device/tf"]``.  It holds TensorFlow's own
gpu_bfc_allocator_test.cc (adapted for a standalone build, see
build_tools/verify/tf_allocator) and tests/conformance/tensorflow_allocator/
lms_bfc_allocator_test.cc, whose writers test runs four threads launching
kernels on one stream while LMS moves their blocks' pages: the launch gate
(CUPTI; the bundle carries libcupti) must hold them, or the process dies of an
illegal address (error 700).
"""

import os
import subprocess
import warnings
from pathlib import Path

import pytest

from build_tools.verify.tf_allocator import LMS_TESTS, WRITERS_TEST as WRITERS, gtest_results
from tests.gpu_requirements import compute_sanitizer, missing

REPO = Path(__file__).resolve().parents[3]
BUNDLE = Path(os.environ.get("TF_LMS_ALLOCATOR_BUNDLE", REPO / ".device" / "tf"))
BINARY = BUNDLE / "tf_lms_allocator_test"

# gtest skips the writers test when the launch gate is inactive; only a missing CUPTI library
# (reason 1) is the machine's fault rather than the code's
NO_CUPTI = "launch gate inactive (reason 1"


@pytest.mark.gpu
def test_tensorflow_lms_allocator_on_gpu(tmp_path):
    if not BINARY.exists():
        missing(f"{BINARY} not built: run python -m build_tools.verify.tf_allocator "
                    "--target cuda --bundle .device/tf on the CPU machine")
    xml = tmp_path / "gtest.xml"
    r = subprocess.run([str(BINARY), f"--gtest_output=xml:{xml}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900, env={**os.environ, "LD_LIBRARY_PATH": str(BUNDLE)})
    tail = "\n".join([l for l in r.stdout.splitlines() if l.startswith("[")][-80:])
    assert r.returncode == 0, tail
    res = gtest_results(xml)
    upstream = [n for n in res if n.startswith("GPUBFCAllocator") and ".DISABLED_" not in n]
    assert len(upstream) >= 25, res
    for name in upstream + list(LMS_TESTS):
        if name == WRITERS and res.get(name) == "skipped" and NO_CUPTI in r.stdout:
            warnings.warn("the writers test was skipped: no CUPTI library on this machine")
            continue
        assert res.get(name) in ("completed", "run"), (name, res.get(name), tail)


# The LMS tests under compute-sanitizer, on a 2 GiB device budget so that the
# instrumented kernels finish in minutes: memcheck finds accesses to pages that
# were unmapped or remapped while a kernel ran, racecheck shared-memory races in
# the test kernels. The writers test runs too (its threads launch while pages
# move: exactly the accesses memcheck must see clean).
SANITIZED = ":".join([
    "LmsBfc.SpilledDataUsableInPlaceAndBroughtBack",
    "LmsBfc.AFailedPageMoveLosesNothing",
    "LmsBfc.DefragRemapsFreePagesWithoutMovingTensors",
    "LmsBfc.RandomWorkloadBytesIntact",
    "LmsBfc.BackwardFreesReturnSpilledDataInBatches",
    "LmsBfc.HostPagesMadeAheadWithinTheHostBudget",
    "LmsBfc.WritersOnOtherThreadsWhilePagesMove",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/0",
])


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_tensorflow_lms_allocator_under_compute_sanitizer(tmp_path, tool):
    if not BINARY.exists():
        missing(f"{BINARY} not built (see the module docstring)")
    san = compute_sanitizer("/usr/local/cuda")
    xml = tmp_path / "gtest.xml"
    # The sanitizer holds CUPTI, so the launch gate cannot subscribe and LMS would fail closed:
    # these single-launcher tests opt in to moves after a synchronization only (the writers
    # test, the one with other launching threads, is still skipped without the gate).
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUNDLE), "LMS_TEST_DEVICE_MB": "2048",
           "LMS_TEST_RACE_SECONDS": "5", "TF_LMS_UNSAFE_MOVE_WITHOUT_GATE": "1"}
    r = subprocess.run([san, "--tool", tool, "--error-exitcode", "97", str(BINARY),
                        f"--gtest_filter={SANITIZED}", f"--gtest_output=xml:{xml}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=500, env=env)
    summary = [l for l in r.stdout.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
    tail = "\n".join(r.stdout.splitlines()[-60:])
    print(f"compute-sanitizer {tool}: rc={r.returncode} {summary}")
    assert r.returncode == 0, tail
    assert summary and all(" 0 error" in l or " 0 hazard" in l for l in summary), tail
    res = gtest_results(xml)
    for name in SANITIZED.split(":"):
        if name == WRITERS and res.get(name) == "skipped":
            # the sanitizer holds CUPTI, so the gate cannot subscribe: the writers test skips, and
            # must say so (any other skip is a failure); the run's output names what was not run
            assert "launch gate inactive (reason" in r.stdout, (
                f"{WRITERS} was skipped under compute-sanitizer without the launch gate's reason", tail)
            warnings.warn(f"compute-sanitizer {tool}: {WRITERS} not run (the launch gate cannot "
                          "subscribe to CUPTI under the sanitizer); the other tests were")
            print(f"compute-sanitizer {tool}: {WRITERS} skipped (no launch gate under the sanitizer)")
            continue
        assert res.get(name) in ("completed", "run"), (name, res.get(name), tail)


@pytest.mark.gpu
def test_tensorflow_lms_allocator_fails_closed_without_the_gate(tmp_path):
    """With a gate that cannot start (TF_LMS_LAUNCH_GATE=0), LMS fails closed on the
    GPU: spills are refused with the reason (no error 700, no lost write, no crash), the writers
    test forced to run (LMS_TEST_RACE_WITHOUT_GATE=1) fails on that refusal, not on lost writes,
    and the failure-path tests (memfd backend) pass."""
    if not BINARY.exists():
        missing(f"{BINARY} not built (see the module docstring)")
    xml = tmp_path / "gtest.xml"
    oversub = "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/0"
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUNDLE), "TF_LMS_LAUNCH_GATE": "0",
           "LMS_TEST_RACE_WITHOUT_GATE": "1", "LMS_TEST_RACE_SECONDS": "5"}
    r = subprocess.run([str(BINARY), f"--gtest_filter={oversub}:{WRITERS}:LmsFailure.*",
                        f"--gtest_output=xml:{xml}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600, env=env)
    tail = "\n".join(r.stdout.splitlines()[-60:])
    assert r.returncode == 1, tail  # test failures, not a crash
    res = gtest_results(xml)
    assert res.get(oversub) == "failed" and res.get(WRITERS) == "failed", (res, tail)
    assert "launch gate is inactive (reason 4" in r.stdout, tail
    # what CUDA says of a fault (error 700), not the refusal's own words, which warn of one
    for bad in ("ILLEGAL_ADDRESS", "IllegalAddress", "illegal memory access", "error 700",
                "CountMismatchesAdd"):
        assert bad not in r.stdout, (bad, tail)
    for name in [n for n in LMS_TESTS if n.startswith("LmsFailure.")]:
        assert res.get(name) in ("completed", "run"), (name, res.get(name), tail)


MULTI_DEVICE = "LmsMultiDevice.TwoDevicesMoveWhileEachWritesTheOthersMemory"


@pytest.mark.gpu
def test_tensorflow_two_gpus_move_while_each_writes_the_other(tmp_path):
    """Two GPUs in one process (a 2-GPU machine; skipped with fewer): each GPU's LMS allocator
    spills and returns two tensors round after round while a kernel on the other GPU adds 1 to
    every word of them through the peer mapping of their pages (device or host), and a handshake
    pair of kernels (one per GPU, each spinning until the other ran, as a collective's do) is
    launched from two threads, GPU 1's late. No hang (the test's watchdog exits 3), no fault,
    every word equal to its pattern plus the adds made; quiesce rounds caught with a handshake
    kernel waiting for its held partner are given up and started over."""
    if not BINARY.exists():
        missing(f"{BINARY} not built (see the module docstring)")
    xml = tmp_path / "gtest.xml"
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUNDLE), "LMS_TEST_RACE_SECONDS": "20",
           "LMS_TEST_WATCHDOG_SECONDS": "240"}
    r = subprocess.run([str(BINARY), f"--gtest_filter={MULTI_DEVICE}", f"--gtest_output=xml:{xml}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=400, env=env)
    tail = "\n".join(r.stdout.splitlines()[-80:])
    print("\n".join(l for l in r.stdout.splitlines()
                    if "mover rounds" in l or "Quiesce rounds given up" in l
                    or "Bytes swapped" in l))
    assert r.returncode == 0, tail
    res = gtest_results(xml)
    if res.get(MULTI_DEVICE) == "skipped":
        assert "needs 2 devices" in r.stdout or NO_CUPTI in r.stdout, tail  # or peer access
        pytest.skip("fewer than 2 GPUs (or no CUPTI): " + next(
            (l for l in r.stdout.splitlines() if "needs 2 devices" in l or NO_CUPTI in l), ""))
    assert res.get(MULTI_DEVICE) in ("completed", "run"), (res, tail)


BANDWIDTH = "HostPagesMadeAhead/LmsBandwidth.SpillAndReturnBandwidth"


@pytest.mark.gpu
def test_tensorflow_spill_and_return_bandwidth_at_64mib_pages(tmp_path):
    """The speed claims at a 16 GiB device budget (64 MiB pages, 8 GiB moved), as fractions of a
    pinned copy measured in the same process: warm spill >= 0.70, first spill with host pages made
    ahead >= 0.65 (end to end and the moves alone), return >= 0.70 (FloorsForPage in
    lms_bfc_allocator_test.cc; the whole program above holds the 16 MiB floors at 4 GiB)."""
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built (see the module docstring)")
    xml = tmp_path / "gtest.xml"
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUNDLE), "LMS_TEST_DEVICE_MB": "16384"}
    r = subprocess.run([str(BINARY), f"--gtest_filter={BANDWIDTH}/*", f"--gtest_output=xml:{xml}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300, env=env)
    lines = [l for l in r.stdout.splitlines()
             if any(w in l for w in ("bandwidth (host pages", "Failure", "Expected", "Which is", "spill: "))]
    print("\n".join(lines[-40:]))
    assert r.returncode == 0, "\n".join(r.stdout.splitlines()[-80:])
    res = gtest_results(xml)
    for name in (f"{BANDWIDTH}/0", f"{BANDWIDTH}/1"):
        assert res.get(name) in ("completed", "run"), (name, res)
    assert "64 MiB pages" in r.stdout, "\n".join(lines[-20:])
