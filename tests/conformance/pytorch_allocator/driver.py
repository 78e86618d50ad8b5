"""Scenario driver for the PyTorch-allocator LMS conformance suite (run as a subprocess).

Loads the c10/c10_cuda libraries built from the patched tree plus probe.so (no torch import: the
preinstalled torch has its own libc10_cuda), runs ONE scenario and prints one JSON line
`RESULT {...}`. Usage: python3 driver.py BUILD_DIR PROBE_SO SCENARIO [key=value ...]
"""
import ctypes
import json
import os
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


class Lib:
    def __init__(self, build_dir, probe_so):
        self.c10 = ctypes.CDLL(os.path.join(build_dir, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
        self.cuda = ctypes.CDLL(os.path.join(build_dir, "libc10_cuda.so"), mode=ctypes.RTLD_GLOBAL)
        p = self.p = ctypes.CDLL(probe_so)
        U64, I, D = ctypes.c_ulonglong, ctypes.c_int, ctypes.c_double
        p.probe_alloc.restype = U64
        p.probe_alloc.argtypes = [U64, I, ctypes.POINTER(I)]
        p.probe_free.argtypes = [U64]
        p.probe_fill.argtypes = [U64, U64, ctypes.c_uint, I]
        p.probe_check.argtypes = [U64, U64, ctypes.c_uint, I]
        p.probe_check.restype = ctypes.c_longlong
        p.probe_check_add.argtypes = [U64, U64, ctypes.c_uint, ctypes.c_uint, I]
        p.probe_check_add.restype = ctypes.c_longlong
        p.probe_add_one.argtypes = [U64, U64, U64, I]
        p.probe_record_stream.argtypes = [U64, I]
        p.probe_launch_loop.argtypes = [U64, U64, I]
        p.probe_launch_loop.restype = D
        p.probe_spin.argtypes = [ctypes.c_longlong, I]
        p.probe_foreign_start.argtypes = [U64, U64, I]
        p.probe_foreign_stop.restype = ctypes.c_longlong
        p.probe_error.restype = ctypes.c_char_p
        p.probe_settings.argtypes = [ctypes.c_char_p]
        p.probe_device_total.restype = U64
        p.probe_device_free.restype = U64
        p.probe_pcie_gbps.restype = D
        p.probe_pcie_gbps.argtypes = [U64, I]
        p.probe_location_types.argtypes = [U64, U64, U64, ctypes.POINTER(U64)]
        self.has_lms = hasattr(self.cuda, "c10_lms_stats")
        if self.has_lms:
            self.cuda.c10_lms_stats.restype = U64
            self.cuda.c10_lms_stats.argtypes = [I, ctypes.c_char_p, U64]
        if p.probe_init(4) != 0:
            raise RuntimeError(p.probe_error().decode())

    def settings(self, s):
        if self.p.probe_settings(s.encode()) != 0:
            raise RuntimeError(self.p.probe_error().decode())

    def alloc(self, n, stream=-1):
        oom = ctypes.c_int(0)
        ptr = self.p.probe_alloc(n, stream, ctypes.byref(oom))
        if not ptr:
            return None, bool(oom.value), self.p.probe_error().decode(errors="replace")
        return ptr, False, ""

    def free(self, ptr):
        if self.p.probe_free(ptr) != 0:
            raise RuntimeError(self.p.probe_error().decode())

    def fill(self, ptr, n, seed, stream=-1):
        assert self.p.probe_fill(ptr, n, seed, stream) == 0

    def check(self, ptr, n, seed, stream=-1):
        r = self.p.probe_check(ptr, n, seed, stream)
        if r < 0:
            raise RuntimeError("check failed: " + self.p.probe_error().decode())
        return r

    def lms(self):
        if not self.has_lms:
            return {}
        buf = ctypes.create_string_buffer(8192)
        self.cuda.c10_lms_stats(0, buf, 8192)
        out = {}
        for line in buf.value.decode().splitlines():
            k, v = line.split("=", 1)
            out[k] = int(v)
        return out

    def stats(self):
        a = (ctypes.c_longlong * 8)()
        self.p.probe_stats(a)
        return dict(zip(["allocated", "allocated_peak", "reserved", "reserved_peak", "num_ooms", "num_alloc_retries"], a[:6]))


def sc_oversubscribe(L, lms="1", factor="2.0", chunk_mb="1024"):
    if lms == "1":
        L.settings("lms:True")
    total = L.p.probe_device_total()
    chunk = int(chunk_mb) * MiB
    target = int(float(factor) * total)
    chunks, oom, msg = [], False, ""
    t0 = time.time()
    while len(chunks) * chunk < target:
        ptr, oom, msg = L.alloc(chunk)
        if ptr is None:
            break
        L.fill(ptr, chunk, len(chunks) + 1)
        chunks.append(ptr)
    t_alloc = time.time() - t0
    allocated = len(chunks) * chunk
    after_alloc = L.lms()
    t0 = time.time()
    bad = sum(L.check(p, chunk, i + 1) for i, p in enumerate(chunks))
    t_check = time.time() - t0
    # free the newest half: room returns, swapped pages must come back intact
    half = len(chunks) // 2
    for p in chunks[half:]:
        L.free(p)
    after_free = L.lms()
    bad_after_return = sum(L.check(p, chunk, i + 1) for i, p in enumerate(chunks[:half]))
    L.p.probe_empty_cache()
    after_empty = L.lms()
    bad_after_empty = sum(L.check(p, chunk, i + 1) for i, p in enumerate(chunks[:half]))
    for p in chunks[:half]:
        L.free(p)
    final = L.lms()
    return dict(device_total=total, target=target, allocated=allocated, oom=oom, oom_msg=msg[:2000],
                mismatches=bad, mismatches_after_return=bad_after_return,
                mismatches_after_empty_cache=bad_after_empty, t_alloc_s=t_alloc, t_check_s=t_check,
                lms_after_alloc=after_alloc, lms_after_free=after_free, lms_after_empty=after_empty,
                lms_final=final, upstream=L.stats())


def _guard(L):
    """lms_swap's eviction net, built into the probe library in its c10-only mode
    (lms-swap/src/lms_swap/lms_swap_guard.cpp, LMS_GUARD_C10_ONLY)."""
    g, U, I = L.p, ctypes.c_ulonglong, ctypes.c_int
    g.lms_guard_error.restype = ctypes.c_char_p
    g.lms_guard_set_host_budget.argtypes = [ctypes.c_longlong] * 3
    for f in ("lms_guard_slot_new", "lms_guard_block_new"):
        getattr(g, f).restype = ctypes.c_longlong
        getattr(g, f).argtypes = [U, ctypes.POINTER(I)]
    for f in ("lms_guard_slot_device", "lms_guard_slot_host", "lms_guard_block_device"):
        getattr(g, f).restype = U
        getattr(g, f).argtypes = [ctypes.c_longlong]
    for f in ("lms_guard_slot_drop", "lms_guard_block_drop"):
        getattr(g, f).argtypes = [ctypes.c_longlong]
    g.lms_guard_counters.argtypes = [ctypes.c_char_p, I]
    g.probe_check_host.restype = ctypes.c_longlong
    g.probe_check_host.argtypes = [U, U, ctypes.c_uint]
    return g


def _net_counters(g):
    buf = ctypes.create_string_buffer(4096)
    g.lms_guard_counters(buf, 4096)
    return {k: int(v) for k, v in (line.split("=") for line in buf.value.decode().splitlines())}


def sc_net(L, lms="1", slots="0.45", blocks="1.0", alloc_host="0.25", chunk_mb="1024"):
    """The two layers together. Slots (activations the swapping layer kept on the device,
    registered with the net) fill `slots` of the device, then plain blocks (what the net
    does not hold) `blocks` of it are allocated through the allocator's `allocate`. With
    the allocator's LMS on (host budget `alloc_host` of the device) it spills pages first
    and the net catches only what it cannot serve; without it the net catches alone. Each
    block records which layer acted while it was allocated; every byte is checked."""
    g = _guard(L)
    total = L.p.probe_device_total()
    chunk = int(chunk_mb) * MiB
    if lms == "1":
        L.settings(f"lms:True,lms_host_mem_limit_mb:{int(float(alloc_host) * total) // MiB}")
    assert g.lms_guard_arm(1) == 0, g.lms_guard_error()
    g.lms_guard_set_host_budget(-1, 0, 8 * GiB)      # no limit of its own; keep 8 GiB available
    oom = ctypes.c_int(0)
    slot_ids = []
    while len(slot_ids) * chunk < float(slots) * total:
        sid = g.lms_guard_slot_new(chunk, ctypes.byref(oom))
        assert sid >= 0, g.lms_guard_error()
        L.fill(g.lms_guard_slot_device(sid), chunk, 1000 + sid)
        slot_ids.append(sid)
    L.p.probe_sync()
    blocks_out, failure = [], None
    t0 = time.time()
    while len(blocks_out) * chunk < float(blocks) * total:
        a0, n0 = L.lms(), _net_counters(g)
        bid = g.lms_guard_block_new(chunk, ctypes.byref(oom))
        if bid < 0:
            resident = sum(1 for s in slot_ids if g.lms_guard_slot_device(s))
            failure = dict(oom=bool(oom.value), msg=g.lms_guard_error().decode()[:1500],
                           resident_slots=resident)
            break
        L.fill(g.lms_guard_block_device(bid), chunk, 1 + bid)
        a1, n1 = L.lms(), _net_counters(g)
        blocks_out.append(dict(
            id=bid,
            allocator_spilled=a1.get("swap_out_bytes", 0) - a0.get("swap_out_bytes", 0),
            net_caught=n1["ooms_caught"] - n0["ooms_caught"],
            net_evicted=n1["evicted_bytes"] - n0["evicted_bytes"]))
    t_alloc = time.time() - t0
    L.p.probe_sync()
    bad_blocks = sum(L.check(g.lms_guard_block_device(b["id"]), chunk, 1 + b["id"]) for b in blocks_out)
    bad_slots, evicted = 0, 0
    for sid in slot_ids:
        dev = g.lms_guard_slot_device(sid)
        if dev:
            bad_slots += L.check(dev, chunk, 1000 + sid)
        else:
            evicted += 1
            bad_slots += g.probe_check_host(g.lms_guard_slot_host(sid), chunk, 1000 + sid)
    lms_stats, net = L.lms(), _net_counters(g)
    for b in blocks_out:
        g.lms_guard_block_drop(b["id"])
    for sid in slot_ids:
        g.lms_guard_slot_drop(sid)
    first = lambda key: next((i for i, b in enumerate(blocks_out) if b[key] > 0), None)  # noqa: E731
    return dict(device_total=total, chunk=chunk, n_slots=len(slot_ids), n_blocks=len(blocks_out),
                blocks_target=-(-int(float(blocks) * total) // chunk), failure=failure,
                first_allocator_spill=first("allocator_spilled"), first_net_catch=first("net_caught"),
                blocks=blocks_out, slots_evicted=evicted, mismatches_blocks=bad_blocks,
                mismatches_slots=bad_slots, t_alloc_s=t_alloc, lms=lms_stats, net=net)


def sc_bandwidth(L, limit_gb="8", size_gb="8", reserve_mb="auto", settle_s="0", gate="1", page_mb="auto"):
    """Swap A out by allocating B under an LMS limit, three times.

    The first round's host pages are made on the way (reserve_mb=0, or the
    automatic reserve, which makes nothing before LMS has moved something), or
    ahead of need by the pool's filler (a set reserve), which starts when A's
    allocation fills the limit past 3/4; settle_s is how long the job may
    compute after that before it asks for B (a training step's forward takes
    that long to fill a device), ended early once the pool holds A's size.
    Later rounds find the pages of the round before in the pool. gate=0 turns
    the launch gate off (what the gate's CUPTI subscription costs the moves). page_mb sets
    the large pool's page (lms_page_mb; auto: LMS's own, see CUDALargeModelSupport.h)."""
    ref_d2h = L.p.probe_pcie_gbps(2 * GiB, 0)
    ref_h2d = L.p.probe_pcie_gbps(2 * GiB, 1)
    conf = f"lms:True,lms_limit_mb:{int(float(limit_gb) * 1024)}"
    if reserve_mb != "auto":
        conf += f",lms_host_reserve_mb:{reserve_mb}"
    if gate == "0":
        conf += ",lms_launch_gate:False"
    if page_mb != "auto":
        conf += f",lms_page_mb:{page_mb}"
    L.settings(conf)
    n = int(float(size_gb) * GiB)
    a, _, m = L.alloc(n)
    assert a, m
    L.fill(a, n, 7)
    t0 = time.time()
    while time.time() - t0 < float(settle_s) and L.lms()["host_pool.idle_bytes"] < n:
        time.sleep(0.05)
    settled = dict(wait_s=round(time.time() - t0, 2), pool_idle_bytes=L.lms()["host_pool.idle_bytes"])
    rounds = []
    for r in range(3):
        s0 = L.lms()
        b, _, m = L.alloc(n)
        assert b, m
        s1 = L.lms()
        L.fill(b, n, 100 + r)
        bad_b = L.check(b, n, 100 + r)
        L.free(b)
        s2 = L.lms()
        bad_a = L.check(a, n, 7)
        out_b = s1["swap_out_bytes"] - s0["swap_out_bytes"]
        out_ns = s1["swap_out_time_ns"] - s0["swap_out_time_ns"]
        in_b = s2["swap_in_bytes"] - s1["swap_in_bytes"]
        in_ns = s2["swap_in_time_ns"] - s1["swap_in_time_ns"]
        rounds.append(dict(out_bytes=out_b, out_gbps=out_b / out_ns if out_ns else 0.0,
                           in_bytes=in_b, in_gbps=in_b / in_ns if in_ns else 0.0,
                           bad_a=bad_a, bad_b=bad_b, host_pool_total=s1["host_pool.total_bytes"],
                           made_on_demand=s1["host_pool.made_on_demand_bytes"]
                           - s0["host_pool.made_on_demand_bytes"],
                           out_ms=out_ns / 1e6,
                           out_quiesce_ms=(s1["swap_out_quiesce_ns"] - s0["swap_out_quiesce_ns"]) / 1e6,
                           out_copy_wait_ms=(s1["swap_out_copy_wait_ns"] - s0["swap_out_copy_wait_ns"]) / 1e6))
    L.free(a)
    return dict(ref_d2h_gbps=ref_d2h, ref_h2d_gbps=ref_h2d, settled=settled, rounds=rounds, lms=L.lms(),
                page_bytes=L.lms().get("page_bytes.large", 0))


def sc_late_enable(L, size_gb="4", reserve_mb="4096", settle_s="15"):
    """LMS switched on after a large block exists: its expandable segment, made with LMS off,
    keeps upstream's 20 MiB page. The next allocation that needs new pages starts the pool's
    filler (the device is past 3/4 of the limit); once it settles, a second block of the same
    size spills the first. The host pages made ahead must be of the first block's page, or the
    spill makes its pages on the way."""
    L.settings("expandable_segments:True")
    n = int(float(size_gb) * GiB)
    a, _, m = L.alloc(n)
    assert a, m
    L.fill(a, n, 7)
    L.settings(f"lms:True,lms_limit_mb:{int(float(size_gb) * 1024) + 1024},"
               f"lms_host_reserve_mb:{reserve_mb}")
    t, _, m = L.alloc(64 * MiB)              # more than the segment's free tail: new pages
    assert t, m
    t0 = time.time()
    want = min(int(reserve_mb) * MiB, n) * 9 // 10
    while time.time() - t0 < float(settle_s) and L.lms()["host_pool.idle_bytes"] < want:
        time.sleep(0.05)
    s0 = L.lms()
    b, _, m = L.alloc(n)
    assert b, m
    s1 = L.lms()
    L.fill(b, n, 8)
    bad_b = L.check(b, n, 8)
    L.free(b)
    bad_a = L.check(a, n, 7)
    L.free(a)
    L.free(t)
    return dict(settle_s=round(time.time() - t0, 2), pool_idle_bytes=s0["host_pool.idle_bytes"],
                out_bytes=s1["swap_out_bytes"] - s0["swap_out_bytes"],
                made_on_demand=s1["host_pool.made_on_demand_bytes"] - s0["host_pool.made_on_demand_bytes"],
                out_gbps=(s1["swap_out_bytes"] - s0["swap_out_bytes"])
                / max(1, s1["swap_out_time_ns"] - s0["swap_out_time_ns"]),
                new_page_bytes=s1.get("page_bytes.large", 0), bad_a=bad_a, bad_b=bad_b, lms=L.lms())


def sc_fork_exit(L):
    """The host pool's filler is running when the process forks; the child exits
    through exit() (its atexit handlers run) and must not wait for a filler
    thread it does not have."""
    L.settings("lms:True,lms_limit_mb:2048,lms_host_reserve_mb:1024")
    p, _, m = L.alloc(1800 * MiB)            # past 3/4 of the limit: the filler starts
    assert p, m
    t0 = time.time()
    while time.time() - t0 < 10 and L.lms()["host_pool.idle_bytes"] == 0:
        time.sleep(0.02)
    idle_at_fork = L.lms()["host_pool.idle_bytes"]
    pid = os.fork()
    if pid == 0:
        sys.exit(0)                          # Python finalizes, then the C exit handlers run
    t0 = time.time()
    status = None
    while time.time() - t0 < 30:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.05)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    L.free(p)
    return dict(idle_at_fork=idle_at_fork, child_status=status,
                child_exit_s=round(time.time() - t0, 2), lms=L.lms())


def sc_stats(L):
    L.settings("lms:True,lms_limit_mb:2048")
    s_start = L.lms()
    ptrs = []
    for i in range(12):                      # 12 x 256 MiB = 3 GiB under a 2 GiB limit
        p, _, m = L.alloc(256 * MiB)
        assert p, m
        L.fill(p, 256 * MiB, i + 11)
        ptrs.append(p)
    mid = L.lms()
    bad = sum(L.check(p, 256 * MiB, i + 11) for i, p in enumerate(ptrs))
    for p in ptrs[6:]:
        L.free(p)
    after_free = L.lms()
    L.cuda.c10_lms_reset_peak_stats(0)
    after_reset = L.lms()
    for p in ptrs[:6]:
        L.free(p)
    L.p.probe_empty_cache()
    end = L.lms()
    return dict(start=s_start, mid=mid, after_free=after_free, after_reset=after_reset, end=end,
                n_allocs=12, mismatches=bad, upstream=L.stats())


def sc_memory_stats(L, tree):
    """The patched tree's torch.cuda.memory_stats() (its memory.py and lms.py, see
    patched_memory_stats.py) over this allocator: lms.* keys before, during and after a spill."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTORCH_LMS_LIBC10_CUDA"] = L.cuda._name   # the library loaded here
    import patched_memory_stats

    def raw(device):
        u = L.stats()
        return {"allocated_bytes": {"all": {"current": u["allocated"], "peak": u["allocated_peak"]}},
                "reserved_bytes": {"all": {"current": u["reserved"], "peak": u["reserved_peak"]}},
                "num_ooms": u["num_ooms"]}

    memory_stats = patched_memory_stats.load(tree, raw)
    keep = lambda d: {k: v for k, v in d.items() if k.startswith("lms.") or k.endswith("_bytes.all.current")}  # noqa: E731
    L.settings("lms:True,lms_limit_mb:2048")
    start = keep(memory_stats(0))
    ptrs = []
    for i in range(12):                      # 12 x 256 MiB = 3 GiB under a 2 GiB limit
        p, _, m = L.alloc(256 * MiB)
        assert p, m
        L.fill(p, 256 * MiB, i + 21)
        ptrs.append(p)
    spilled, spilled_raw = keep(memory_stats(0)), L.lms()
    bad = sum(L.check(p, 256 * MiB, i + 21) for i, p in enumerate(ptrs))
    for p in ptrs:
        L.free(p)
    L.p.probe_empty_cache()
    freed = keep(memory_stats(0))
    sys.modules["_lms_tree_torch_cuda.lms"]._reset_peak_stats(0)   # what reset_peak_memory_stats calls
    after_reset = keep(memory_stats(0))
    return dict(start=start, spilled=spilled, spilled_raw=spilled_raw, freed=freed,
                after_reset=after_reset, mismatches=bad, n_bytes=12 * 256 * MiB)


LOCATIONS = ("device", "host", "host_numa", "host_numa_current", "other", "not_vmm")


def sc_host_pages(L, step_mb="2"):
    """What backs spilled data: with 3 GiB allocated under a 2 GiB limit, the location type of
    the VMM allocation mapped at every 2 MiB of the blocks (driver API, probe_location_types).
    Spilled pages must be host (NUMA) allocations, pinned by construction, never pageable."""
    L.settings("lms:True,lms_limit_mb:2048")
    blk, step = 256 * MiB, int(step_mb) * MiB
    ptrs = []
    for i in range(12):
        p, _, m = L.alloc(blk)
        assert p, m
        L.fill(p, blk, i + 31)
        ptrs.append(p)
    lms = L.lms()
    counts = (ctypes.c_ulonglong * 6)()
    total = dict.fromkeys(LOCATIONS, 0)
    for p in ptrs:
        if L.p.probe_location_types(p, blk, step, counts) != 0:
            raise RuntimeError(L.p.probe_error().decode())
        for k, v in zip(LOCATIONS, counts):
            total[k] += v * step
    bad = sum(L.check(p, blk, i + 31) for i, p in enumerate(ptrs))
    for p in ptrs:
        L.free(p)
    return dict(bytes_by_location=total, lms=lms, mismatches=bad, n_bytes=12 * blk)


def sc_hostlimit(L):
    L.settings("lms:True,lms_limit_mb:1024,lms_host_mem_limit_mb:512")
    ptrs, msg, oom = [], "", False
    for i in range(8):                       # 8 x 256 MiB: needs > 512 MiB of host swap
        p, oom, msg = L.alloc(256 * MiB)
        if p is None:
            break
        L.fill(p, 256 * MiB, i + 1)
        ptrs.append(p)
    bad = sum(L.check(p, 256 * MiB, i + 1) for i, p in enumerate(ptrs))
    s = L.lms()
    for p in ptrs:
        L.free(p)
    # a single block larger than the device
    big, oom2, msg2 = L.alloc(L.p.probe_device_total() + GiB)
    return dict(n_ok=len(ptrs), oom=oom, msg=msg, mismatches=bad, lms=s, too_large_oom=oom2,
                too_large_msg=msg2)


def sc_defrag(L, mode="upstream"):
    if mode == "lms_defrag":
        L.settings("lms:True,lms_defrag:True,lms_host_mem_limit_mb:0")
    elif mode == "lms_nodefrag":
        L.settings("lms:True,lms_defrag:False,lms_host_mem_limit_mb:0")
    total = L.p.probe_device_total()
    n = int(0.9 * total) // GiB
    big = []
    for i in range(n):
        p, oom, m = L.alloc(GiB)
        assert p, m
        big.append(p)
    small, mid = [], []
    s_sz, t_sz = 12 * MiB, GiB - 12 * MiB
    for i in range(n):
        L.free(big[i])
        s, _, m = L.alloc(s_sz)
        assert s, m
        t, _, m = L.alloc(t_sz)
        assert t, m
        L.fill(s, s_sz, 1000 + i)
        small.append(s)
        mid.append(t)
    for t in mid:
        L.free(t)
    req = total // 2
    p, oom, msg = L.alloc(req)
    ok = p is not None
    if ok:
        L.fill(p, req, 5)
        bad_big = L.check(p, req, 5)
        L.free(p)
    else:
        bad_big = 0
    bad = sum(L.check(s, s_sz, 1000 + i) for i, s in enumerate(small))
    return dict(mode=mode, n_segments=n, request=req, ok=ok, oom=oom, msg=msg[:3000], mismatches=bad,
                mismatches_big=bad_big, lms=L.lms(), upstream=L.stats())


def sc_multistream(L, limit_mb="1024", rounds="6", spin="200000000"):
    """Pending writers/readers on other streams while LMS swaps the pages they use."""
    L.settings(f"lms:True,lms_limit_mb:{limit_mb}")
    n = 128 * MiB
    spin = int(spin)
    bad, bad_y, kept = 0, 0, []
    for r in range(int(rounds)):
        # (1) a pending writer on the block's own stream: spin then fill on stream 0
        x, _, m = L.alloc(n, 0)
        assert x, m
        L.p.probe_spin(spin, 0)
        L.fill(x, n, 50 + r, 0)
        # (2) a pending reader on stream 1 that was announced with record_stream
        y, _, m = L.alloc(n, 1)
        assert y, m
        L.p.probe_wait(1, 0)                      # the reader depends on the writer
        L.p.probe_spin(spin, 1)
        L.p.probe_add_one(x, y, n, 1)
        L.p.probe_record_stream(x, 1)
        kept.append((x, y, 50 + r))
        # (3) pressure: allocations on stream 2 push the pages of x and y out while (1)/(2) are queued
        z, _, m = L.alloc(int(limit_mb) * MiB // 2, 2)
        assert z, m
        L.fill(z, int(limit_mb) * MiB // 2, 9, 2)
        L.free(z)
    L.p.probe_sync()
    for x, y, seed in kept:
        bad += L.check(x, n, seed, 0)
        r = L.p.probe_check_add(y, n, seed, 1, 1)   # y = x + 1, written on stream 1
        assert r >= 0
        bad_y += r
    for x, y, _ in kept:
        L.free(x)
        L.free(y)
    L.p.probe_sync()
    return dict(mismatches_x=bad, mismatches_y=bad_y, lms=L.lms())


def sc_foreign(L, limit_mb="1024", seconds="60", passes="64", mb="128"):
    """A host thread the allocator knows nothing of increments a block on a stream of its own
    while pressure makes LMS move that block's pages out and back. Every word must end as
    its pattern plus the increments the thread completed."""
    L.settings(f"lms:True,lms_limit_mb:{limit_mb}")
    n = int(mb) * MiB
    x, _, m = L.alloc(n)
    assert x, m
    L.fill(x, n, 77)
    L.p.probe_sync()
    assert L.p.probe_foreign_start(x, n, int(passes)) == 0
    before = L.lms()
    t0, rounds, big = time.time(), 0, int(limit_mb) * MiB // 2
    while time.time() - t0 < float(seconds):
        held = []
        for i in range(3):              # 1.5x the limit: the oldest blocks, x first, go out
            z, _, m = L.alloc(big, 2)
            assert z, m
            L.fill(z, big, 1000 + i, 2)
            held.append(z)
        for z in held:                  # freed: x's pages come back for the next round
            L.free(z)
        rounds += 1
    done = L.p.probe_foreign_stop()
    L.p.probe_sync()
    after = L.lms()
    bad = L.p.probe_check_add(x, n, 77, max(done, 0) & 0xFFFFFFFF, -1) if done >= 0 else -1
    L.free(x)
    return dict(increments=done, mismatches=bad, rounds=rounds,
                swapped_out=after.get("swap_out_bytes", 0) - before.get("swap_out_bytes", 0),
                swapped_in=after.get("swap_in_bytes", 0) - before.get("swap_in_bytes", 0), lms=after)


def sc_remap_failure(L):
    """One page move fails partway (PYTORCH_LMS_TEST_FAIL_REMAP, set by the test, fails the Nth
    remap after its unmap, as an out-of-memory cuMemMap would). 8 blocks of 240 MiB fit a 2 GiB
    limit on both tags' pages (v1.13.1 rounds each block's segment up to 20 MiB); a 9th spills.
    Then 4 blocks are freed and the cache emptied, which brings pages back.
    Reports whether the 9th was served, every block's bytes after it and at the end, the pages
    each phase moved and the host bytes bookkeeping."""
    L.settings("lms:True,lms_limit_mb:2048")
    n = 240 * MiB
    blocks = []
    for i in range(8):
        p, _, m = L.alloc(n)
        assert p, m
        L.fill(p, n, 300 + i)
        blocks.append(p)
    s0 = L.lms()
    q, oom, msg = L.alloc(n)
    s1 = L.lms()
    first = dict(served=bool(q), oom=oom, msg=msg[:800],
                 pages_out=s1["swap_out_count"] - s0["swap_out_count"])
    bad_after_first = sum(L.check(p, n, 300 + i) for i, p in enumerate(blocks))
    retry_msg = ""
    if not q:                                   # the job goes on: the next allocation spills again
        q, _, retry_msg = L.alloc(n)
    if q:
        L.fill(q, n, 999)
    for p in blocks[4:]:
        L.free(p)
    L.p.probe_empty_cache()
    s2 = L.lms()
    bad_end = sum(L.check(p, n, 300 + i) for i, p in enumerate(blocks[:4]))
    bad_q = L.check(q, n, 999) if q else -1
    for p in blocks[:4] + ([q] if q else []):
        L.free(p)
    L.p.probe_empty_cache()
    return dict(first=first, bad_after_first=bad_after_first, retry_served=bool(q), retry_msg=retry_msg[:500],
                pages_in=s2["swap_in_count"] - s1["swap_in_count"], bad_end=bad_end, bad_q=bad_q,
                after_return=s2, end=L.lms())


def sc_launchcost(L, gate="1", launches="20000"):
    """What the launch gate costs a program that does not swap: the host time of one small
    kernel launch (a 4 KiB fill, launched through ctypes), LMS on, the gate on or off."""
    L.settings("lms:True" + ("" if gate == "1" else ",lms_launch_gate:False"))
    x, _, m = L.alloc(4096)
    assert x, m
    for _ in range(200):                     # warm
        L.fill(x, 4096, 1)
    L.p.probe_sync()
    n = int(launches)
    t0 = time.perf_counter()
    for i in range(n):
        L.fill(x, 4096, i)
    L.p.probe_sync()
    us = (time.perf_counter() - t0) / n * 1e6
    # the same launches from C++, 5 rounds of 10n (no ctypes in the loop); the best round
    loop = [L.p.probe_launch_loop(x, 10 * n, 0) / (10 * n) * 1e6 for _ in range(5)]
    L.free(x)
    return dict(us_per_launch=us, launches=n, us_per_launch_cpp=min(loop), us_cpp_rounds=loop,
                lms=L.lms())


def sc_sanitize(L):
    """A small spill-heavy run for compute-sanitizer (swap out, zero-copy reads, swap in)."""
    L.settings("lms:True,lms_limit_mb:256")
    n = 64 * MiB
    ptrs = []
    for i in range(8):
        p, _, m = L.alloc(n, i % 2)
        assert p, m
        L.fill(p, n, i + 1, i % 2)
        if i % 2:
            L.p.probe_record_stream(p, 0)
        ptrs.append(p)
    L.p.probe_sync()
    bad = sum(L.check(p, n, i + 1, 0) for i, p in enumerate(ptrs))
    for p in ptrs[4:]:
        L.free(p)
    L.p.probe_empty_cache()
    bad += sum(L.check(p, n, i + 1, 1) for i, p in enumerate(ptrs[:4]))
    for p in ptrs[:4]:
        L.free(p)
    L.p.probe_sync()
    return dict(mismatches=bad, lms=L.lms())


def sc_sequence(L, lms="0"):
    """A fixed allocation sequence; its upstream stats must not depend on the patch when LMS is off."""
    if lms == "1":
        L.settings("lms:True")
    sizes = [512, 3 * MiB, 11 * MiB, 700 * 1024, 25 * MiB, 2 * MiB, 100 * MiB, 1]
    live, trace = [], []
    for r in range(40):
        sz = sizes[r % len(sizes)] * (1 + r % 3)
        p, _, m = L.alloc(sz)
        assert p, m
        live.append(p)
        if r % 3 == 2:
            L.free(live.pop(0))
        trace.append(L.stats()["reserved"])
    for p in live:
        L.free(p)
    L.p.probe_empty_cache()
    return dict(trace=trace, upstream=L.stats())


def main():
    build_dir, probe, scenario = sys.argv[1:4]
    kw = dict(a.split("=", 1) for a in sys.argv[4:])
    L = Lib(build_dir, probe)
    t0 = time.time()
    res = globals()["sc_" + scenario](L, **kw)
    res["wall_s"] = time.time() - t0
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
