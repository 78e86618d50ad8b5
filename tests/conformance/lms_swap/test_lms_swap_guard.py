"""GPU tests of lms_swap's eviction net (lms_swap_guard.cpp): a wrong forecast costs
speed, never the job.  Each case runs forecast_wrong.py in its own process (it fills the
device with ballast).  Run on the GPU machine: python -m pytest -m gpu tests/conformance/lms_swap
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SCRIPT = pathlib.Path(__file__).with_name("forecast_wrong.py")


def _run(mode: str) -> dict:
    torch.cuda.empty_cache()  # this process's cache is not the child's room
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    p = subprocess.run([sys.executable, str(SCRIPT), mode], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def cuda_only():
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available")


def test_the_jump_kills_a_job_without_the_net(cuda_only):
    """The case is real: stock PyTorch, and swapping without the net, die at the jump."""
    for mode in ("stock", "noguard"):
        out = _run(mode)
        assert out["result"] == "oom" and out["oom_step"] == 5, json.dumps(out)


def test_the_net_keeps_a_wrong_forecast_training_bitwise(cuda_only):
    out = _run("guard")
    assert out["result"] == "trained", json.dumps(out)
    assert out["bitwise_equal"], json.dumps(out)
    st = out["stats"]
    assert st["guard.active"] == 1 and st["guard.evicted_bytes"] > 0, json.dumps(st)
    assert st["swap.guard_fetched"] > 0, st  # evicted tensors came back for backward
    assert st["guard.host_bytes"] == 0, st  # and their host copies were given back


def test_a_first_step_that_needs_2x_trains_with_defaults(cuda_only):
    """No forecast exists in the first step: what does not fit is swapped as the device
    fills (or, where that is too late, moved by the net), the later steps plan it, and
    the last steps need the net no more."""
    out = _run("first2x")
    assert out["result"] == "trained", json.dumps(out)
    assert out["bitwise_equal"], json.dumps(out)
    st, ev = out["stats"], out["evicted_by_step"]
    assert st["swap.out_bytes"] > 0, st  # the step did not fit: activations went out
    later = [b - a for a, b in zip(ev, ev[1:])]
    assert sum(later[-4:]) == 0, ev  # settled
