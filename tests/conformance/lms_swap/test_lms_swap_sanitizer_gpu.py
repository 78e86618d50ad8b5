"""The lms_swap GPU suite's small-model part under compute-sanitizer memcheck and racecheck:
swapping out and back (always, under pressure, with views, checkpointing, side streams,
two backward passes, a backward in another thread, exceptions mid-step), the eviction net's
copy after a side stream's write, and an in-place change after saving.  Each tool must report
no error and the tests under it must pass.  (The large-memory tests, a 2x first step, the
loops, stay out: under memcheck their kernels run hundreds of times slower.)  Run on the GPU
machine:  python -m pytest -m gpu tests/conformance/lms_swap/test_lms_swap_sanitizer_gpu.py
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from tests.gpu_requirements import compute_sanitizer, missing

pytestmark = pytest.mark.gpu
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]

UNDER_SANITIZER = [
    "test_lms_swap_gpu.py::test_bitwise_equal_always_swap",
    "test_lms_swap_gpu.py::test_auto_policy_with_room_does_nothing",
    "test_lms_swap_gpu.py::test_small_tensors_left_alone",
    "test_lms_swap_gpu.py::test_views_noncontiguous_and_transposes",
    "test_lms_swap_gpu.py::test_inplace_after_save_is_detected",
    "test_lms_swap_gpu.py::test_checkpoint",
    "test_lms_swap_gpu.py::test_side_streams",
    "test_lms_swap_gpu.py::test_no_grad_swaps_nothing",
    "test_lms_swap_gpu.py::test_retain_graph_two_backward_passes",
    "test_lms_swap_gpu.py::test_exception_mid_forward_leaks_nothing",
    "test_lms_swap_gpu.py::test_exception_in_backward_leaks_nothing",
    "test_lms_swap_gpu.py::test_host_limit_error_is_clear_and_clean",
    "test_lms_swap_gpu.py::test_backward_in_another_thread",
    "test_lms_swap_gpu.py::test_module_enable_disable",
    "test_lms_swap_net_hazards.py::test_the_nets_copy_waits_for_a_tensor_written_on_a_side_stream",
    "test_lms_swap_net_hazards.py::test_inplace_on_the_base_after_the_saved_view_is_gone_raises_as_stock",
]

# racecheck looks for shared-memory hazards inside kernels: this layer launches none of its
# own (it copies), and on the tests with convolutions it reported hazards inside cuDNN's
# dgrad kernels and ran past 250 s, so it runs on the tests without cuDNN
RACECHECK = [t for t in UNDER_SANITIZER if t.split("::")[1] in (
    "test_views_noncontiguous_and_transposes", "test_inplace_after_save_is_detected",
    "test_checkpoint", "test_exception_in_backward_leaks_nothing",
    "test_the_nets_copy_waits_for_a_tensor_written_on_a_side_stream",
    "test_inplace_on_the_base_after_the_saved_view_is_gone_raises_as_stock")]


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_the_suite_under_compute_sanitizer(tool, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        missing("CUDA not available")
    san = compute_sanitizer("/usr/local/cuda")
    tests = RACECHECK if tool == "racecheck" else UNDER_SANITIZER
    log = tmp_path / f"{tool}.log"
    cmd = [san, "--tool", tool, "--error-exitcode", "97", "--target-processes", "all",
           "--log-file", str(log), sys.executable, "-m", "pytest", "-q", "-m", "gpu",
           "-p", "no:cacheprovider", *[str(HERE / t) for t in tests]]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    report = log.read_text(errors="replace") if log.exists() else ""
    summary = [l for l in report.splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
    print(f"compute-sanitizer {tool}: rc={p.returncode}; " + "; ".join(summary[-3:]))
    print(p.stdout[-600:])
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-2000:], report[-3000:])
    assert summary, report[-3000:]  # the tool ran and said so
    assert all(re.search(r"\b0 (errors|hazards)\b", l) for l in summary), summary
    ran = re.search(r"(\d+) passed", p.stdout)
    assert ran and int(ran.group(1)) >= len(tests), p.stdout[-2000:]
    assert not re.search(r"\d+ (failed|errors?)\b", p.stdout), p.stdout[-2000:]
