"""One scenario of the pluggable LMS allocator (lms_swap.allocator) in a process of its own: the
allocator must be installed before the process allocates anything on the GPU.  Prints one line
``RESULT <json>``.  Used by test_lms_pluggable_allocator_gpu.py.

    python pluggable_worker.py bytes LIMIT_MIB TOTAL_MIB
    python pluggable_worker.py foreign LIMIT_MIB
    python pluggable_worker.py train native|pluggable STEPS [LIMIT_MIB]
    python pluggable_worker.py host-limit LIMIT_MIB TOTAL_MIB
    python pluggable_worker.py bad-setting SETTINGS
    python pluggable_worker.py fraction FRACTION
    python pluggable_worker.py expand
    python pluggable_worker.py host-reserve LIMIT_MIB
    python pluggable_worker.py grow LIMIT_MIB
    python pluggable_worker.py return-release LIMIT_MIB
    python pluggable_worker.py limit-peak LIMIT_MIB
    python pluggable_worker.py whole-card SCALE

Each follows PyTorch's expandable_segments setting in PYTORCH_CUDA_ALLOC_CONF, as the allocator
does.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from swap_package import put_on_path  # noqa: E402

put_on_path()
import torch  # noqa: E402

MiB = 1 << 20
CHUNK = 256 * MiB  # one tensor: several pages


def _enable(limit_mib=None):
    """The allocator installed with LMS on, under ``limit_mib`` where given, with the
    settings of ``LMS_WORKER_SETTINGS`` besides (a scenario under another page, say)."""
    from lms_swap import allocator
    settings = [f"lms_limit_mb:{limit_mib}"] if limit_mib else []
    if os.environ.get("LMS_WORKER_SETTINGS"):
        settings.append(os.environ["LMS_WORKER_SETTINGS"])
    allocator.enable(",".join(settings) or None)
    return allocator


def _pattern(i, n):
    # a value for every int32 of tensor i that no other tensor has at that index
    return torch.arange(n, dtype=torch.int32, device="cuda") * 7 + i * 1_000_003


def bytes_intact(limit_mib, total_mib):
    """Tensors filling total_mib under an LMS limit of limit_mib: every one keeps its bytes,
    after the others pushed it to host memory, and after frees brought pages back."""
    alloc = _enable(limit_mib)
    n = CHUNK // 4
    ts = []
    for i in range(total_mib * MiB // CHUNK):
        t = torch.empty(n, dtype=torch.int32, device="cuda")
        t.copy_(_pattern(i, n))
        ts.append(t)
    torch.cuda.synchronize()
    bad = [i for i, t in enumerate(ts) if not torch.equal(t, _pattern(i, n))]
    out = dict(alloc.lms_stats())
    del ts[::2]  # frees: pages come back as room appears
    torch.cuda.synchronize()
    kept = list(range(1, total_mib * MiB // CHUNK, 2))
    bad_after = [i for i, t in zip(kept, ts) if not torch.equal(t, _pattern(i, n))]
    after = alloc.lms_stats()
    return {"tensors": len(kept) * 2, "bad": bad, "bad_after_frees": bad_after,
            "swap_out_bytes": out.get("swap_out_bytes"), "host_bytes_peak": out.get("host_bytes.peak"),
            "swap_in_bytes": after.get("swap_in_bytes"), "page": after.get("page_bytes.large"),
            "memory": alloc.memory_stats()}


def foreign(limit_mib):
    """A tensor written by a side stream, still queued behind a long kernel there, while the
    main stream's allocations push its pages to host memory: the move waits for that stream, and
    the write lands."""
    alloc = _enable(limit_mib)
    n = CHUNK // 4
    x = torch.zeros(n, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second on an H100
        x.fill_(7)
    x.record_stream(side)
    others = [torch.ones(n, dtype=torch.int32, device="cuda") for _ in range(limit_mib * MiB * 2 // CHUNK)]
    side.synchronize()
    torch.cuda.synchronize()
    st = alloc.lms_stats()
    return {"x_ok": bool((x == 7).all()), "others_ok": all(bool((o == 1).all()) for o in others),
            "swap_out_bytes": st.get("swap_out_bytes"), "host_bytes": st.get("host_bytes.current")}


def train(mode, steps, limit_mib=None):
    """A small convolutional network, deterministic kernels: losses and final weights bitwise,
    and the time of the steps after the first."""
    if mode == "pluggable":
        alloc = _enable(limit_mib)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    layers = []
    c = 3
    for w in (64, 128, 256, 256):
        layers += [torch.nn.Conv2d(c, w, 3, padding=1), torch.nn.BatchNorm2d(w), torch.nn.ReLU()]
        c = w
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(c, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, 3, 128, 128, device="cuda", generator=g)
    y = torch.randint(0, 10, (64,), device="cuda", generator=g)
    losses, t0 = [], None
    for step in range(steps):
        if step == 1:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    out = {"losses": [float.hex(v) for v in losses],
           "weights": float.hex(float(sum(p.double().sum() for p in model.parameters()))),
           "step_s": (time.perf_counter() - t0) / max(1, steps - 1)}
    if mode == "pluggable":
        from lms_swap import device_memory
        out["swapper_sees"] = device_memory.allocated(0)  # what activation swapping reads
        out["lms"] = {k: v for k, v in alloc.lms_stats().items() if k.startswith("swap_")}
        out["memory"] = alloc.memory_stats()
    return out


def host_limit(limit_mib, total_mib):
    """More than the device limit and the host budget together: a torch.OutOfMemoryError with
    LMS's report, not a crash."""
    alloc = _enable(limit_mib)
    ts = []
    try:
        for _ in range(total_mib * MiB // CHUNK):
            ts.append(torch.ones(CHUNK // 4, dtype=torch.int32, device="cuda"))
    except torch.OutOfMemoryError as e:
        return {"raised": "OutOfMemoryError", "message": str(e), "made": len(ts),
                "host_bytes": alloc.lms_stats().get("host_bytes.current")}
    return {"raised": None, "made": len(ts)}


def fraction(frac):
    """torch.cuda.set_per_process_memory_fraction under the LMS allocator: past the fraction,
    pages move to host memory instead of the allocation failing, and every byte stays."""
    alloc = _enable()
    torch.cuda.set_per_process_memory_fraction(frac)
    total = torch.cuda.get_device_properties(0).total_memory
    n = CHUNK // 4
    count = int(2 * frac * total) // CHUNK
    ts = []
    for i in range(count):
        t = torch.empty(n, dtype=torch.int32, device="cuda")
        t.copy_(_pattern(i, n))
        ts.append(t)
    torch.cuda.synchronize()
    bad = [i for i, t in enumerate(ts) if not torch.equal(t, _pattern(i, n))]
    st = alloc.lms_stats()
    return {"tensors": count, "bad": bad, "limit": st.get("limit"),
            "swap_out_bytes": st.get("swap_out_bytes")}


def bad_setting(settings):
    from lms_swap import allocator
    try:
        allocator.enable(settings)
    except ValueError as e:
        return {"raised": "ValueError", "message": str(e), "installed": allocator.enabled()}
    return {"raised": None}


def expand():
    """Eight 1 GiB tensors, all freed, then one of 8 GiB: reserved bytes and segments after each
    phase; then a hole unmapped by empty_cache between live tensors, and a 2 GiB tensor that
    grows past them: every live tensor keeps its bytes."""
    alloc = _enable()
    GiB = 1 << 30
    n = GiB // 4

    def mem():
        m = alloc.memory_stats()
        return {k: m[k] for k in ("reserved_bytes", "device_reserved_bytes", "segments",
                                  "cached_free_bytes", "map_bytes", "map_ns", "unmap_bytes",
                                  "unmap_ns", "release_syncs", "release_sync_ns")}
    def filled(i, numel):  # _pattern(i, numel) written in place: no temporary allocated
        t = torch.arange(numel, dtype=torch.int32, device="cuda")
        return t.mul_(7).add_(i * 1_000_003)
    ts = [torch.empty(n, dtype=torch.int32, device="cuda") for _ in range(8)]
    phases = {"eight": mem()}
    del ts
    phases["freed"] = mem()
    big = filled(0, 8 * n)
    phases["big"] = mem()
    a, b, c = (filled(i, n) for i in (1, 2, 3))
    del b
    torch.cuda.empty_cache()
    phases["hole_unmapped"] = mem()
    d = filled(4, 2 * n)
    torch.cuda.synchronize()
    phases["grown"] = mem()
    bad = [name for name, t, i in (("big", big, 0), ("a", a, 1), ("c", c, 3), ("d", d, 4))
           if not torch.equal(t, _pattern(i, t.numel()))]
    del big, a, c, d
    torch.cuda.empty_cache()
    phases["empty"] = mem()
    st = alloc.lms_stats()
    return {"phases": phases, "bad": bad, "swap_out_bytes": st.get("swap_out_bytes"),
            "page": st.get("page_bytes.large")}


def host_reserve(limit_mib):
    """The automatic host reserve: tensors filling 7/8 of the LMS limit, nothing moved, and a
    pause long enough for the pool's filler to make pages: no host page is made.  Then 1/4 of
    the limit more: pages move, and the pool keeps an idle reserve of at most what moved (and
    at most 1/8 of the limit) made in the background."""
    alloc = _enable(limit_mib)

    def pool():
        st = alloc.lms_stats()
        return {k: st.get(k) for k in ("host_pool.total_bytes", "host_pool.idle_bytes",
                                       "host_pool.reserve_bytes", "host_pool.made_ahead_bytes",
                                       "host_bytes.current", "host_bytes.peak", "swap_out_bytes")}
    n = CHUNK // 4
    ts = [torch.ones(n, dtype=torch.int32, device="cuda")
          for _ in range(limit_mib * MiB * 7 // 8 // CHUNK)]
    torch.cuda.synchronize()
    time.sleep(3)
    fits = pool()
    ts += [torch.ones(n, dtype=torch.int32, device="cuda")
           for _ in range(limit_mib * MiB // 4 // CHUNK)]
    torch.cuda.synchronize()
    moved = pool()
    t0 = time.time()
    while time.time() - t0 < 10 and (pool()["host_pool.idle_bytes"] or 0) < (moved["host_pool.reserve_bytes"] or 0):
        time.sleep(0.05)
    settled = pool()
    bad = sum(int(t.sum().item() != n) for t in ts)
    return {"fits": fits, "moved": moved, "settled": settled, "bad": bad,
            "limit_bytes": limit_mib * MiB}


def grow(limit_mib):
    """A job that grows past its limit while freeing temporaries, as a forward pass does: one
    tensor of CHUNK kept and one temporary of CHUNK freed per round, to 1.5x the limit.  Returns
    after those frees are held back (the room they would bring pages into is what the next
    round needs); the oldest tensor's host pages go back to the host pool when it is freed;
    freeing the newest half of the rest brings the older half's pages back; every tensor keeps
    its bytes."""
    alloc = _enable(limit_mib)
    n = CHUNK // 4
    kept = []
    for i in range(limit_mib * MiB * 3 // 2 // CHUNK):
        # one allocation each (a pattern would make temporaries of its own)
        kept.append(torch.full((n,), i, dtype=torch.int32, device="cuda"))
        tmp = torch.ones(n, dtype=torch.int32, device="cuda")
        del tmp
    torch.cuda.synchronize()
    grown = dict(alloc.lms_stats())
    del kept[0]  # the oldest: its pages are on the host
    torch.cuda.synchronize()
    torch.empty(1, device="cuda")  # an allocation lists the frees whose streams are past them
    dropped = dict(alloc.lms_stats())
    del kept[len(kept) // 2:]  # the newest, on the device: room for the oldest to come back
    torch.cuda.synchronize()
    back = dict(alloc.lms_stats())
    # kept[0] went first, so the tensor at position j holds the value j + 1
    bad = [i for i, t in enumerate(kept, start=1) if not bool((t == i).all())]
    # every counter of each phase: a failed assertion prints them all
    return {"grown": grown, "dropped": dropped, "back": back, "bad": bad, "chunk": CHUNK}


def return_release(limit_mib):
    """Chunks up to the limit with a 2 GiB tensor the newest of them, then one chunk more: the
    oldest chunk moves to the host.  Freeing the 2 GiB tensor brings it back; of the free
    cache that return releases what the pages coming back need (at least 1/16 of the limit),
    and the rest stays cached for the next allocations.  Every tensor keeps its bytes."""
    alloc = _enable(limit_mib)
    n = CHUNK // 4
    big_bytes = 2 << 30
    kept = [torch.full((n,), i, dtype=torch.int32, device="cuda")
            for i in range((limit_mib * MiB - big_bytes) // CHUNK)]
    big = torch.full((big_bytes // 4,), -1, dtype=torch.int32, device="cuda")
    kept.append(torch.full((n,), len(kept), dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()

    def state():
        st = alloc.lms_stats()
        out = {k: st.get(k) for k in ("swap_out_bytes", "swap_in_bytes", "host_bytes.current",
                                      "defrag_released_bytes", "returns_held")}
        out["cached_free_bytes"] = alloc.memory_stats()["cached_free_bytes"]
        return out
    before = state()
    del big
    torch.cuda.synchronize()
    after = state()
    bad = [i for i, t in enumerate(kept) if not bool((t == i).all())]
    return {"before": before, "after": after, "bad": bad, "big": big_bytes,
            "limit_bytes": limit_mib * MiB, "page": alloc.lms_stats().get("page_bytes.large")}


def limit_peak(limit_mib):
    """Tensors of 1/4, 1/4, 1/4 and 1/5 of the limit, the last freed: a free run at the end of
    the range.  A tensor of 2/5 of the limit grows into that run and past it, and what it maps
    passes the limit: its pages must come from the oldest tensor's, moved first, and the run it
    grows into must stay mapped (a release that unmapped it would have the request map those
    pages again, past the room it was given).  The device's pages never pass the limit, and
    every tensor keeps its bytes."""
    alloc = _enable(limit_mib)
    quarter = limit_mib * MiB // 4 // 4  # int32 elements
    kept = [torch.full((quarter,), i, dtype=torch.int32, device="cuda") for i in range(3)]
    tail = torch.empty(limit_mib * MiB // 5, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del tail
    before = dict(alloc.lms_stats())
    grown = torch.full((limit_mib * MiB * 2 // 5 // 4,), 3, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    kept.append(grown)
    after = dict(alloc.lms_stats())
    bad = [i for i, t in enumerate(kept) if not bool((t == i).all())]
    return {"before": before, "after": after, "memory": alloc.memory_stats(), "bad": bad,
            "limit": after.get("limit")}


def whole_card(scale, held=None):
    """With no LMS limit, tensors of ``scale`` times the card: then, on threads that never used
    the GPU, a matrix product each, whose cuBLAS handle (cublasCreate) the library allocates
    outside the allocator, from what the card has free.  ``held``: called once the allocator
    is installed, before anything is allocated (a benchmark's card hold); what it returns is
    ``info``.  Returns what stayed free, the products' outcomes and the tensors' bytes."""
    import threading
    alloc = _enable()
    info = held() if held else None
    free0, total = torch.cuda.mem_get_info()
    n = CHUNK // 4
    ts = []
    while len(ts) * CHUNK < scale * total:
        t = torch.empty(n, dtype=torch.int32, device="cuda")
        t.fill_(len(ts))
        ts.append(t)
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    products = []

    def product():
        try:
            a = torch.ones(512, 512, device="cuda")
            products.append(float((a @ a)[0, 0]))
        except RuntimeError as e:
            products.append(str(e).splitlines()[0])

    for _ in range(2):
        th = threading.Thread(target=product)
        th.start()
        th.join()
    bad = [i for i, t in enumerate(ts) if not bool((t == i).all())]
    return {"info": info, "total": total, "free_before": free0, "free_after": free_after,
            "tensors": len(ts), "bad": bad, "products": products, "lms": alloc.lms_stats()}


def main():
    what, args = sys.argv[1], sys.argv[2:]
    if what == "bytes":
        r = bytes_intact(int(args[0]), int(args[1]))
    elif what == "foreign":
        r = foreign(int(args[0]))
    elif what == "train":
        r = train(args[0], int(args[1]), int(args[2]) if len(args) > 2 else None)
    elif what == "host-limit":
        r = host_limit(int(args[0]), int(args[1]))
    elif what == "fraction":
        r = fraction(float(args[0]))
    elif what == "expand":
        r = expand()
    elif what == "host-reserve":
        r = host_reserve(int(args[0]))
    elif what == "grow":
        r = grow(int(args[0]))
    elif what == "return-release":
        r = return_release(int(args[0]))
    elif what == "limit-peak":
        r = limit_peak(int(args[0]))
    elif what == "whole-card":
        r = whole_card(float(args[0]))
    elif what == "bad-setting":
        r = bad_setting(args[0])
    else:
        raise SystemExit(f"unknown scenario {what!r}")
    print("RESULT " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
