"""GPU tests of the pluggable LMS allocator (lms_swap.allocator): the patched build's LMS core
under stock PyTorch, each scenario in a process of its own (pluggable_worker.py), since the
allocator must be installed before anything is allocated on the GPU.

    python -m pytest -m gpu tests/conformance/lms_swap/test_lms_pluggable_allocator_gpu.py -v

The first test compiles the library (one to three minutes; later processes reuse it).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

HERE = pathlib.Path(__file__).resolve().parent
GiB_MiB = 1024


def _run(*args, env=None, timeout=600):
    p = subprocess.run([sys.executable, str(HERE / "pluggable_worker.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(lines[-1][7:])


@pytest.fixture(scope="module", autouse=True)
def cuda_and_library():
    from tests.gpu_requirements import missing
    if not torch.cuda.is_available():
        missing("CUDA not available")
    from tests.conformance.lms_swap.swap_package import put_on_path
    put_on_path()
    from lms_swap import allocator
    reason = allocator.refusal()
    if reason:
        missing(f"the LMS pluggable allocator cannot be built here: {reason}")
    allocator.build()  # compiled once here, so that no scenario's timeout pays for it


def test_the_library_uses_the_processs_cxx_runtime():
    """The library needs the shared libstdc++.so.6 that torch uses, not a static copy of its own
    (which a compiler without the libstdc++.so development link makes, and whose first number
    formatted in a std::ostringstream crashes the process)."""
    from lms_swap import allocator
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils)")
    lib = allocator.build().__file__
    dynamic = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in dynamic, dynamic


# PyTorch's allocator settings the allocator follows: its own segment per large request (64 MiB
# pages, cut to the request), and one growing range per stream (expandable_segments, stock's
# 20 MiB page); each also with the other's page: 20 MiB is no power of two (a segment's address
# range is aligned to a power of two that divides its page)
SEGMENTS = {"fixed": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            "fixed-20mib": {"PYTORCH_CUDA_ALLOC_CONF": "", "LMS_WORKER_SETTINGS": "lms_page_mb:20"},
            "expandable-64mib": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                 "LMS_WORKER_SETTINGS": "lms_page_mb:64"}}
PAGE_MIB = {"expandable": 20, "fixed-20mib": 20, "expandable-64mib": 64}


@pytest.mark.parametrize("segments", sorted(SEGMENTS))
def test_every_byte_survives_twice_the_limit(segments):
    """16 GiB of distinct int32 patterns under an LMS limit of 8 GiB: half of them live in host
    memory at the end, and every tensor reads back its own values, before and after frees."""
    r = _run("bytes", 8 * GiB_MiB, 16 * GiB_MiB, env=SEGMENTS[segments])
    assert r["bad"] == [] and r["bad_after_frees"] == [], r
    assert r["swap_out_bytes"] >= 7 * 2**30, r
    assert r["host_bytes_peak"] >= 7 * 2**30, r
    assert 0 < r["memory"]["peak_device_reserved_bytes"] <= 8 * 2**30, r
    if segments in PAGE_MIB:
        assert r["page"] == PAGE_MIB[segments] * 2**20, r


@pytest.mark.parametrize("segments", sorted(SEGMENTS))
def test_a_side_streams_write_lands_while_its_pages_move(segments):
    """A tensor whose write is queued on a side stream behind a 1 s kernel (record_stream) is
    pushed to host memory by the main stream's allocations: the move waits for that stream."""
    r = _run("foreign", 2 * GiB_MiB, env=SEGMENTS[segments])
    assert r["x_ok"] and r["others_ok"], r
    assert r["swap_out_bytes"] > 0, r


def test_training_at_stock_memory_is_bitwise_stocks_and_as_fast():
    """With nothing to move, a training loop under the LMS allocator gives the native caching
    allocator's losses and weights bit for bit, at >= 95% of its speed."""
    native = _run("train", "native", 12)
    mine = _run("train", "pluggable", 12)
    assert mine["losses"] == native["losses"] and mine["weights"] == native["weights"]
    assert mine["lms"]["swap_out_bytes"] == 0, mine
    # activation swapping reads this allocator's own count, not the driver's in-use bytes
    assert mine["swapper_sees"] == mine["memory"]["allocated_bytes"] > 0, mine
    assert native["step_s"] / mine["step_s"] >= 0.95, (native["step_s"], mine["step_s"])


def test_training_under_a_limit_below_its_peak_is_bitwise_stocks():
    """The same loop with an LMS limit under its peak: pages move every step, and the losses and
    weights stay the native allocator's bit for bit."""
    native = _run("train", "native", 6)
    probe = _run("train", "pluggable", 2)
    peak_mib = probe["memory"]["peak_allocated_bytes"] // 2**20
    limited = _run("train", "pluggable", 6, max(512, peak_mib * 2 // 3))
    assert limited["losses"] == native["losses"] and limited["weights"] == native["weights"]
    assert limited["lms"]["swap_out_bytes"] > 0, (peak_mib, limited)


def test_past_the_host_budget_it_raises_out_of_memory_with_lms_report():
    """An LMS limit of 1 GiB and a host budget of 1 GiB, asked for 4 GiB: torch.OutOfMemoryError
    naming the host limit and how to raise it, after what fitted was moved."""
    r = _run("host-limit", 1 * GiB_MiB, 4 * GiB_MiB,
             env={"PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB": "1024"})
    assert r["raised"] == "OutOfMemoryError", r
    assert "LMS pluggable allocator" in r["message"], r
    assert "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB" in r["message"], r
    assert r["made"] >= 4, r


def test_expandable_segments_reuse_freed_neighbours_and_unmap_on_release():
    """With expandable_segments: eight freed 1 GiB tensors serve one of 8 GiB with no new memory
    (each in a segment of its own, they cannot: reserved would double); empty_cache unmaps a
    freed hole between live tensors, a later tensor grows past them, every live tensor keeps
    its bytes, and after the last free empty_cache leaves nothing reserved.  Stock's 20 MiB
    page does not divide 1 GiB: the pages at the hole's two edges, partly under the live
    tensors beside it, stay mapped.  The mapping's own counters add up: with nothing moved to
    host, what was mapped less what was unmapped is what is reserved, after every phase; the
    unmap and the growth are timed, and the unmap waited on a device synchronization."""
    GiB = 2**30
    r = _run("expand", env=SEGMENTS["expandable"])
    ph = r["phases"]
    assert r["bad"] == [] and not r["swap_out_bytes"], r
    for name, m in ph.items():
        assert m["map_bytes"] - m["unmap_bytes"] == m["reserved_bytes"], (name, m)
    assert ph["big"]["map_bytes"] == ph["eight"]["map_bytes"] > 0, ph
    assert ph["eight"]["map_ns"] > 0, ph
    hole, grown = ph["hole_unmapped"], ph["grown"]
    assert hole["unmap_bytes"] - ph["big"]["unmap_bytes"] >= GiB - 2 * r["page"], ph
    assert hole["unmap_ns"] > ph["big"]["unmap_ns"], ph
    assert hole["release_syncs"] > ph["big"]["release_syncs"], ph
    assert hole["release_sync_ns"] > ph["big"]["release_sync_ns"], ph
    assert grown["map_bytes"] - hole["map_bytes"] >= 2 * GiB - 2**27, ph
    assert grown["map_ns"] > hole["map_ns"], ph
    assert ph["eight"]["reserved_bytes"] >= 8 * GiB, ph
    assert ph["big"]["reserved_bytes"] == ph["eight"]["reserved_bytes"], ph
    assert (ph["hole_unmapped"]["reserved_bytes"]
            <= ph["big"]["reserved_bytes"] + 2 * GiB + 2 * r["page"]), r
    assert ph["grown"]["reserved_bytes"] >= ph["hole_unmapped"]["reserved_bytes"] + 2 * GiB - 2**27, ph
    assert ph["empty"]["reserved_bytes"] < GiB // 8, ph
    fixed = _run("expand", env=SEGMENTS["fixed"])
    assert fixed["bad"] == [], fixed
    for name, m in fixed["phases"].items():
        assert m["map_bytes"] - m["unmap_bytes"] == m["reserved_bytes"], (name, m)
    assert fixed["phases"]["big"]["reserved_bytes"] >= 16 * GiB, fixed["phases"]


def test_a_job_that_fits_holds_no_host_pages_and_the_reserve_follows_what_moved():
    """Under an 8 GiB limit, 7/8 of it allocated and a pause: no host page made ahead (a job
    that fits keeps stock's host memory).  A quarter more moves pages: the pool's idle reserve,
    made in the background, is no more than what moved and no more than 1/8 of the limit."""
    r = _run("host-reserve", 8 * GiB_MiB)
    fits, moved, settled = r["fits"], r["moved"], r["settled"]
    assert fits["swap_out_bytes"] in (0, None), r
    assert fits["host_pool.total_bytes"] == 0 and fits["host_pool.reserve_bytes"] == 0, r
    assert moved["swap_out_bytes"] > 0 and r["bad"] == 0, r
    reserve = settled["host_pool.reserve_bytes"]
    assert 0 < reserve <= min(settled["host_bytes.peak"], r["limit_bytes"] // 8), r
    assert settled["host_pool.idle_bytes"] >= reserve, r
    assert settled["host_pool.total_bytes"] <= settled["host_bytes.current"] + reserve + 2 * 2**26, r


def test_pages_come_back_only_where_they_can_stay():
    """A job growing to 1.5x its 2 GiB limit while it frees a 256 MiB temporary each round:
    no tensor's pages come back while it grows (each would go out again at the next round),
    and the returns held back are counted.  What may come in is a page a new block shares
    with a swapped neighbour (it must be on the device to be written): less than half a
    tensor.  (045e426, which returned pages on every free, brought 500 MiB back here.)  The
    oldest tensor, on the host, is freed: its whole pages go back to the host pool.  The
    newest half of the rest is freed: the older half's pages come back.  Every tensor keeps
    its bytes."""
    r = _run("grow", 2 * GiB_MiB, env=SEGMENTS["expandable"])
    grown, dropped, back = r["grown"], r["dropped"], r["back"]
    assert grown["swap_out_bytes"] >= 2**30, r
    assert grown["swap_in_bytes"] < r["chunk"] // 2 and grown["returns_held"] > 0, r
    assert grown["host_bytes.current"] - dropped["host_bytes.current"] >= r["chunk"] - 2 * 20 * 2**20, r
    assert dropped["host_pages_dropped_on_free"] > grown["host_pages_dropped_on_free"], r
    assert back["swap_in_bytes"] > 0, r
    assert r["bad"] == [], r


def test_a_return_releases_only_the_cache_its_pages_need():
    """Under a 4 GiB limit a 2 GiB tensor is freed while a 256 MiB chunk lies on the host: the
    chunk comes back, and the free cache is released only as far as its pages and the return's
    floor (1/16 of the limit) need, so at least 1 GiB of the 2 GiB freed stays cached, for the
    next allocations to use without mapping it again.  Before (1758707) every return released
    the whole free cache first: here about 2 GiB."""
    GiB = 2**30
    r = _run("return-release", 4 * GiB_MiB, env=SEGMENTS["expandable"])
    before, after = r["before"], r["after"]
    assert before["host_bytes.current"] >= r["page"], r  # the oldest chunk is on the host
    assert after["host_bytes.current"] < 2 * r["page"], r  # and came back
    released = after["defrag_released_bytes"] - before["defrag_released_bytes"]
    assert 0 < released <= GiB, r
    assert after["cached_free_bytes"] >= GiB, r
    assert r["bad"] == [], r


def test_a_request_that_grows_past_the_limit_never_maps_past_it():
    """Under a 4000 MiB limit (200 of stock's 20 MiB pages), with expandable_segments: a free run
    of 800 MiB at the end of the range, and a 1600 MiB tensor that grows into it and 800 MiB
    past it.  The allocator's device pages stay under the limit throughout (its peak), pages of
    the oldest tensor moved to make room before the request mapped (the core's net, which spills
    what a request maps past the limit after the fact, never fired), and every tensor keeps its
    bytes.  Before (d64abb2) the release made for the request unmapped 600 MiB of the run it then
    grew into, it mapped them again past the limit, and the peak was 4600 MiB."""
    r = _run("limit-peak", 4000, env=SEGMENTS["expandable"])
    assert r["bad"] == [] and r["limit"] == 4000 * 2**20, r
    assert r["after"]["swap_out_bytes"] >= 600 * 2**20, r
    # Both figures in either message: a failure shows whether the net fired as well as the peak.
    seen = {"peak": r["memory"]["peak_device_reserved_bytes"], "limit": r["limit"],
            "limit_spills": r["after"]["limit_spills"],
            "limit_spill_bytes": r["after"]["limit_spill_bytes"]}
    assert seen["peak"] <= seen["limit"], seen
    assert seen["limit_spills"] == 0, seen


@pytest.mark.parametrize("segments", ["fixed", "expandable"])
def test_memory_outside_the_allocator_finds_room_on_a_card_lms_filled(segments):
    """1.25 times the card in tensors with no LMS limit: the allocator keeps the foreign reserve
    (1/64 of the card, at least 256 MiB) free by moving pages out before it maps more, so that
    what is allocated outside it still fits: two threads new to the GPU each make a cuBLAS
    handle (cublasCreate allocates on the device) and multiply.  Before the reserve, the
    allocator mapped until the driver refused, and the first matrix product of a classifier's
    head at 2x (ResNet-50, run 252) failed with CUBLAS_STATUS_ALLOC_FAILED."""
    r = _run("whole-card", 1.25, env=SEGMENTS[segments])
    reserve = max(256 * 2**20, r["total"] // 64)
    assert r["bad"] == [], r
    assert r["products"] == [512.0, 512.0], r
    assert r["lms"]["swap_out_bytes"] >= 0.2 * r["total"], r
    # the last request may map into the reserve by what its own page rounds up to
    assert r["free_after"] >= reserve - 64 * 2**20, r
    assert r["lms"]["reserve_reclaims"] > 0, r


def test_a_bad_setting_is_refused_naming_it_before_anything_is_installed():
    r = _run("bad-setting", "lms_limit_mb:lots")
    assert r["raised"] == "ValueError" and "lms_limit_mb" in r["message"], r
    assert r["installed"] is False, r


def test_a_memory_fraction_becomes_the_lms_limit():
    """set_per_process_memory_fraction(0.1), then 20% of the card allocated: where the native
    allocator raises, pages past the fraction move to host memory, every byte intact."""
    r = _run("fraction", 0.1)
    assert r["bad"] == [] and r["tensors"] >= 8, r
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < r["limit"] <= 0.1 * total + 2**20, r
    assert r["swap_out_bytes"] >= 0.05 * total, r


@pytest.mark.parametrize("scenario", [("bytes", 1 * GiB_MiB, 2 * GiB_MiB), ("foreign", 512),
                                      ("train", "pluggable", 3, 4 * GiB_MiB)])
def test_page_moves_are_clean_under_compute_sanitizer_memcheck(scenario, tmp_path):
    """The scenarios that move pages (bytes at twice the limit, a side stream's write, training
    under a limit), small, under compute-sanitizer memcheck: no error, and each still passes."""
    from tests.gpu_requirements import compute_sanitizer
    san = compute_sanitizer("/usr/local/cuda")
    log = tmp_path / "memcheck.log"
    p = subprocess.run([san, "--tool", "memcheck", "--error-exitcode", "97", "--log-file", str(log),
                        sys.executable, str(HERE / "pluggable_worker.py"), *map(str, scenario)],
                       capture_output=True, text=True, timeout=500)
    report = log.read_text(errors="replace") if log.exists() else ""
    summary = [x for x in report.splitlines() if "ERROR SUMMARY" in x]
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:], report[-3000:])
    assert summary and all(re.search(r"\b0 errors\b", x) for x in summary), report[-3000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(lines[-1][7:])
    if scenario[0] == "bytes":
        assert r["bad"] == [] and r["bad_after_frees"] == [] and r["swap_out_bytes"] > 0, r
    elif scenario[0] == "foreign":
        assert r["x_ok"] and r["others_ok"] and r["swap_out_bytes"] > 0, r
    else:
        assert r["lms"]["swap_out_bytes"] > 0, r
