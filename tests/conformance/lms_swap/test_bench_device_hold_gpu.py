"""GPU tests of how the benchmarks hold a larger card to a smaller one's size
(examples/pytorch/benchmarks/device_cap.py), stock PyTorch with expandable segments.

    python -m pytest -m gpu tests/conformance/lms_swap/test_bench_device_hold_gpu.py -v

Held by PyTorch's memory fraction, the caching allocator checks the whole request against
the fraction before expandable segments would map only what the request lacks, so a request
the segment's free tail mostly covers makes it release its cache and retry, where the real
card maps a few pages.  Held by a ballast, the card refuses only what the smaller card would.
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

BENCH = pathlib.Path(__file__).resolve().parents[3] / "examples" / "pytorch" / "benchmarks"
GiB = 1 << 30
HELD_SMALLER_BY = 8 * GiB

# In a process of its own (a ballast is held for the process's life): the card held as
# asked, then a large block, a 2 GiB block after it freed (the segment's free tail), and a
# 3 GiB request that the tail covers but for 1 GiB; then what the held card refuses.
WORKER = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import device_cap
GiB = 1 << 30
info = device_cap.apply(torch)
free, _ = torch.cuda.mem_get_info()
room = info["allocator_cap_bytes"] if info["hold"] == "fraction" else free
big = torch.empty(room - 4 * GiB, dtype=torch.uint8, device="cuda")
tail = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
del tail
before = torch.cuda.memory_stats()["num_alloc_retries"]
third = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
retries = torch.cuda.memory_stats()["num_alloc_retries"] - before
del third, big
torch.cuda.empty_cache()
try:
    over = torch.empty(room + 2 * GiB, dtype=torch.uint8, device="cuda")
    refused = False
except torch.OutOfMemoryError:
    refused = True
print("HOLD " + json.dumps({"info": info, "free": free, "retries": retries,
                            "refused": refused}), flush=True)
"""


def _held(how):
    total = torch.cuda.get_device_properties(0).total_memory
    if total < 3 * HELD_SMALLER_BY:
        pytest.skip(f"a card of {total} bytes is too small to hold 8 GiB smaller")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               LMS_BENCH_DEVICE_GIB=repr((total - HELD_SMALLER_BY) / GiB),
               LMS_BENCH_DEVICE_HOLD=how)
    p = subprocess.run([sys.executable, "-c", WORKER, str(BENCH)], capture_output=True,
                       text=True, env=env, timeout=300)
    lines = [x for x in p.stdout.splitlines() if x.startswith("HOLD ")]
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(lines[-1][5:])


def test_a_card_held_by_a_ballast_maps_what_a_request_lacks_without_a_release():
    """Held by a ballast, the 3 GiB request is served by mapping 1 GiB after the free tail,
    as on the smaller card: no release of the cache.  The ballast took the surplus from
    the driver, and the held card refuses a block 2 GiB larger than its room."""
    r = _held("ballast")
    assert r["info"]["hold"] == "ballast", r
    assert abs(r["info"]["ballast_bytes"] - HELD_SMALLER_BY) < 64 << 20, r
    assert r["retries"] == 0, r
    assert r["refused"], r


def test_a_card_held_by_the_fraction_releases_its_cache_for_the_same_request():
    """The same under the fraction: the allocator releases its cache and retries for the
    3 GiB request (what makes the fraction's figures lower than the real card's near its
    edge)."""
    r = _held("fraction")
    assert r["info"]["hold"] == "fraction", r
    assert r["retries"] == 1, r
    assert r["refused"], r
