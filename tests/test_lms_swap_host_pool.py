"""CPU tests of LMS activation swapping's pinned host pool (lms-swap/src/lms_swap/host_pool.py),
run unpinned: pieces carved from chunks, the host limit and the machine's available memory,
giving memory back after steps that need less, and what the eviction net is told of it.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import pathlib
import sys
import threading
import time

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip

from tests.lms_swap_cpu import MiB, assert_equal_tensors, cpu_swapper

nn = torch.nn

REPO = pathlib.Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ host pool
def test_pool_exact_sizes_carved_from_one_chunk(m):
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, chunk_bytes=4 * MiB)
    a = pool.alloc(1000003)
    b = pool.alloc(12345)
    assert a.numel() == 1000003 and b.numel() == 12345  # no rounding
    assert pool.in_use == 1000003 + 12345
    assert pool.reserved == 4 * MiB and pool.blocks == 1
    assert pool.misses == 1 and pool.hits == 1
    assert b.data_ptr() - a.data_ptr() == 1003520       # ranges start on 4 KiB
    a.fill_(1)
    b.fill_(2)
    assert a.sum().item() == 1000003                     # the ranges do not overlap
    pool.free(a)
    assert pool.in_use == 12345 and pool.cached == 4 * MiB - 12345
    c = pool.alloc(1000003)                              # best fit: a's range again
    assert c.data_ptr() == a.data_ptr() and pool.hits == 2 and pool.misses == 1
    pool.free(b)
    pool.free(c)
    s = pool.stats()
    assert s["host.in_use_bytes"] == 0
    assert s["host.free_ranges"] == 1 and s["host.largest_free_bytes"] == 4 * MiB  # merged
    assert pool.empty_cache() == 4 * MiB
    assert pool.reserved == 0 and pool.blocks == 0
    with pytest.raises(ValueError, match="chunk_bytes"):
        m.HostPool(keep_seconds=0, limit=1, pin=False, chunk_bytes=0)


def test_pool_serves_other_sizes_from_what_it_pinned(m):
    """Steps that swap other tensors than the step before (a first step that swapped
    under pressure, then a planned one; variable sequence lengths) are served from the
    same chunks: the pool grows only when the bytes in use do."""
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, chunk_bytes=32 * MiB)
    bufs = [pool.alloc(3 * MiB) for _ in range(8)]      # 24 MiB
    for b in bufs:
        pool.free(b)
    assert pool.stats()["host.free_ranges"] == 1        # merged back into one range
    g = torch.Generator().manual_seed(0)
    for step in range(20):                              # up to 24 MiB of random sizes
        left, bufs = 24 * MiB, []
        while True:
            n = int(torch.randint(4096, 6 * MiB, (1,), generator=g))
            if n > left:
                break
            bufs.append(pool.alloc(n))
            left -= m.host_pool._round_up(n, 4096)
        order = torch.randperm(len(bufs), generator=g).tolist()
        for i in order:                                 # returned in any order
            pool.free(bufs[i])
        assert pool.end_step() == 0
    assert pool.misses == 1 and pool.reserved == 32 * MiB
    assert pool.stats()["host.free_ranges"] == 1


def test_pool_pieces_span_chunks(m):
    """A request larger than every free range is served from several ranges (of other
    chunks) instead of pinning a chunk of its own; the bytes round-trip in order."""
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, chunk_bytes=4 * MiB)
    bufs = [pool.alloc(3 * MiB) for _ in range(4)]      # 4 chunks, 1 MiB left in each
    for b in bufs:
        pool.free(b)
    assert pool.stats()["host.free_ranges"] == 4 and pool.misses == 4
    pieces = pool.alloc_pieces(14 * MiB + 5)
    assert [p.numel() for p in pieces] == [4 * MiB] * 3 + [2 * MiB + 5]
    assert pool.misses == 4 and pool.reserved == 16 * MiB  # nothing new pinned
    assert pool.in_use == 14 * MiB + 5
    src = torch.randint(0, 256, (14 * MiB + 5,), dtype=torch.uint8)
    m.copies.copy_into_pieces(pieces, src, non_blocking=False)
    back = torch.empty_like(src)
    m.copies.copy_from_pieces(back, pieces, non_blocking=False)
    assert torch.equal(back, src)
    one = pool.alloc_pieces(MiB)                         # fits one range: one piece
    assert len(one) == 1 and pool.misses == 4
    for p in pieces + one:
        pool.free(p)
    s = pool.stats()
    assert s["host.in_use_bytes"] == 0 and s["host.free_ranges"] == 4
    assert s["host.largest_free_bytes"] == 4 * MiB


def test_pool_pieces_grow_only_by_what_is_missing(m):
    """Free ranges under 2 MiB are not used as pieces; what the free ranges lack comes
    from one new chunk; a request that cannot be served leaves the pool as it was."""
    gc.collect()                                         # earlier tests' pools go, and
    m.HostPool.wait_released()                           # count no longer (shared thread)
    pool = m.HostPool(keep_seconds=0, limit=24 * MiB, pin=False, chunk_bytes=8 * MiB)
    a = pool.alloc(7 * MiB)                              # chunk 1: 1 MiB left
    b = pool.alloc(5 * MiB)                              # chunk 2: 3 MiB left
    pieces = pool.alloc_pieces(6 * MiB)                  # 3 MiB of chunk 2 + 3 MiB new
    assert [p.numel() for p in pieces] == [3 * MiB, 3 * MiB]
    assert pool.misses == 3 and pool.reserved == 24 * MiB
    before = pool.stats()
    with pytest.raises(m.LMSHostMemoryError):
        pool.alloc_pieces(9 * MiB)                       # 1 + 5 MiB free: not enough
    after = pool.stats()
    for k in ("host.in_use_bytes", "host.reserved_bytes", "host.free_ranges",
              "host.largest_free_bytes"):
        assert after[k] == before[k], k
    for p in pieces + [a, b]:
        pool.free(p)
    assert pool.in_use == 0 and pool.stats()["host.free_ranges"] == 3


def test_steps_that_swap_other_sizes_reuse_the_pool(m):
    """A first step that swaps many small tensors, then steps that swap a few large
    ones (an EfficientNet's reactive first step, then its plan): the large ones are
    served in pieces from the first step's chunks."""
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, chunk_bytes=4 * MiB)
    small = [pool.alloc(MiB + 4096 * i) for i in range(24)]
    for b in small:
        pool.free(b)
    pool.end_step()
    reserved, misses = pool.reserved, pool.misses        # 32 MiB in 8 chunks
    for _ in range(10):
        big = [p for _ in range(3) for p in pool.alloc_pieces(7 * MiB)]
        for p in big:
            pool.free(p)
        pool.end_step()
    assert pool.misses == misses                         # nothing pinned again
    assert pool.reserved == 24 * MiB < reserved          # the 2 chunks not used went back


def test_swapped_tensors_split_into_pieces_round_trip_bitwise(m):
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, chunk_bytes=2 * MiB)
    for b in [pool.alloc(2 * MiB) for _ in range(32)]:   # 32 chunks of 2 MiB, all free
        pool.free(b)
    sw = cpu_swapper(m, pool=pool)

    def train(ctx):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))
        x = torch.randn(768, 1024, generator=torch.Generator().manual_seed(1))  # 3 MiB
        out = []
        for _ in range(2):
            model.zero_grad()
            with ctx():
                loss = model(x).square().mean()
            loss.backward()
            out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
        return out

    assert_equal_tensors(train(contextlib.nullcontext), train(lambda: sw))
    s = sw.stats()
    assert s["swap.out_count"] >= 4 and s["swap.in_bytes"] == s["swap.out_bytes"]
    assert s["host.pool_misses"] == 32 and s["host.reserved_bytes"] == 64 * MiB
    assert s["host.in_use_bytes"] == 0


def test_pool_limit_releases_idle_chunks_then_raises(m):
    pool = m.HostPool(keep_seconds=0, limit=3 * MiB, pin=False)
    a = pool.alloc(2 * MiB)  # a chunk of 256 MiB does not fit the limit: one of 2 MiB
    assert pool.reserved == 2 * MiB
    pool.free(a)
    b = pool.alloc(MiB + 1)  # another size, carved from the same chunk
    assert pool.evictions == 0 and pool.reserved == 2 * MiB and pool.hits == 1
    c = pool.alloc(MiB)      # the rest of that chunk is too small: a 1 MiB chunk
    assert pool.reserved == 3 * MiB and pool.blocks == 2
    with pytest.raises(m.LMSHostMemoryError) as ei:
        pool.alloc(MiB)
    msg = str(ei.value)
    assert "PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB" in msg and "3.00 MiB" in msg
    assert isinstance(ei.value, torch.OutOfMemoryError)
    assert pool.reserved <= pool.limit and pool.peak_reserved <= pool.limit
    pool.free(b)
    pool.free(c)
    assert pool.in_use == 0
    d = pool.alloc(2 * MiB + MiB // 2)  # fits no free range: both idle chunks go
    assert pool.evictions == 2 and pool.reserved == 2 * MiB + MiB // 2
    pool.free(d)


def test_pool_keeps_machine_memory_available(m):
    avail = {"bytes": 10 * MiB}

    def available():
        return avail["bytes"]

    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, min_available=4 * MiB, available_fn=available)
    a = pool.alloc(5 * MiB)  # leaves 5 MiB: fine
    avail["bytes"] -= 5 * MiB
    with pytest.raises(m.LMSHostMemoryError, match="nearly exhausted"):
        pool.alloc(2 * MiB)  # would leave 3 MiB < 4 MiB
    pool.free(a)
    assert pool.in_use == 0


def test_pool_shared_budget_with_allocator(m):
    class Budget:  # stands for torch.cuda.lms._host_reserve/_host_release
        def __init__(self, limit):
            self.limit, self.used = limit, 0

        def reserve(self, n):
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

        def release(self, n):
            self.used -= n

    budget = Budget(4 * MiB)
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, reserve_fn=budget.reserve, release_fn=budget.release)
    a = pool.alloc(3 * MiB)
    assert budget.used == 3 * MiB
    pool.free(a)
    b = pool.alloc(2 * MiB)  # carved from the 3 MiB chunk: no more of the budget
    assert budget.used == 3 * MiB and pool.evictions == 0
    with pytest.raises(m.LMSHostMemoryError, match="shared with the CUDA allocator"):
        pool.alloc(3 * MiB)
    pool.free(b)
    pool.empty_cache()
    assert budget.used == 0


def test_env_host_limit(m, monkeypatch):
    monkeypatch.setenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB", "1536")
    assert m.host_mem_limit_from_env() == 1536 * MiB
    sw = m.ActivationSwapper(device_type="cpu")
    assert sw.pool.limit == 1536 * MiB
    monkeypatch.setenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB", "lots")
    with pytest.raises(ValueError, match="PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB"):
        m.host_mem_limit_from_env()
    monkeypatch.setenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB", "-1")
    with pytest.raises(ValueError, match="must not be negative"):
        m.host_mem_limit_from_env()
    monkeypatch.delenv("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB")
    assert m.host_mem_limit_from_env() is None


def test_env_swap_threshold(m, monkeypatch):
    monkeypatch.setenv("PYTORCH_LMS_SWAP_THRESHOLD_IN_KB", "2048")
    assert m.SwapConfig().size_threshold == 2 * MiB
    monkeypatch.setenv("PYTORCH_LMS_SWAP_THRESHOLD_IN_KB", "big")
    with pytest.raises(ValueError, match="PYTORCH_LMS_SWAP_THRESHOLD_IN_KB='big': expected a number of KiB"):
        m.SwapConfig()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_pool_gives_host_memory_back_after_steps_that_need_less(m):
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False)
    assert pool.keep_steps == 8
    bufs = [pool.alloc(64 * MiB) for _ in range(4)]
    for b in bufs:
        b.fill_(1)                                    # resident pages
    for b in bufs:
        pool.free(b)
    del bufs, b
    held = _rss()
    for _ in range(pool.keep_steps):                  # this step used 256 MiB, and it
        assert pool.end_step() == 0                   # is one of the last keep_steps
    assert pool.reserved == 256 * MiB
    assert pool.end_step() == 256 * MiB               # keep_steps steps used none of it
    assert pool.reserved == 0 and pool.blocks == 0
    pool.wait_released()                              # given back on the pool's thread
    assert held - _rss() > 200 * MiB                  # the pages went back to the kernel


def test_pool_keeps_what_recent_steps_used(m):
    """A cycle of steps that swap more and less pins nothing after its first round (the
    pool keeps every buffer one of the last keep_steps steps handed out)."""
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, keep_steps=4, chunk_bytes=4 * MiB)
    for step in range(12):                            # 16, 8, 8, 8 MiB, in turn
        bufs = [pool.alloc(4 * MiB) for _ in range(4 if step % 4 == 0 else 2)]
        for b in bufs:
            pool.free(b)
        assert pool.end_step() == 0
        assert pool.reserved == 16 * MiB
    assert pool.misses == 4
    for _ in range(4):                                # then steps that swap nothing
        pool.end_step()
    assert pool.reserved == 0


def test_pool_keeps_sizes_that_alternate_between_steps(m):
    """Steps whose swapped sizes differ (a decoder's fp32 logits swapped in two steps of
    four) keep both sets pinned: the union of what recent steps used, not the most one
    step had in use, which gave the large buffer back and pinned it again every cycle."""
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, keep_steps=8, chunk_bytes=4 * MiB)
    for step in range(16):
        sizes = [4 * MiB] * 3 + ([24 * MiB] if step % 4 in (2, 3) else [])
        bufs = [pool.alloc(n) for n in sizes]
        for b in bufs:
            pool.free(b)
        assert pool.end_step() == 0
    assert pool.misses == 4                           # pinned once, in the first cycle
    assert pool.reserved == 36 * MiB


def test_pool_learns_to_keep_what_a_periodic_pass_pins(m):
    """An evaluation pass every 10 steps that swaps more than the training steps: once
    the pool has given its extra chunks back and had to pin them again, it keeps chunks
    idle for twice that period (giving them back after 8 steps cost 2.5-4 s of pinning
    in every pass on the H100).  Idle longer than that, they go back."""
    now = {"t": 0.0}
    pool = m.HostPool(limit=1 << 40, pin=False, keep_steps=8, chunk_bytes=4 * MiB,
                      keep_seconds=5.0, clock=lambda: now["t"])
    misses = []
    for step in range(40):
        now["t"] += 1.0                               # 1 s steps
        bufs = [pool.alloc(4 * MiB) for _ in range(6 if step % 10 == 9 else 2)]
        for b in bufs:
            pool.free(b)
        pool.end_step()
        misses.append(pool.misses)
    assert misses[9] == 6 and misses[19] == 10        # given back once, pinned again
    assert pool.keep_seconds == 20.0                  # twice 10 s from last use to need
    assert misses[-1] == 10 and pool.reserved == 24 * MiB  # kept from then on
    for _ in range(19):
        now["t"] += 1.0
        pool.end_step()
    assert pool.reserved == 24 * MiB                  # idle 19 s < 20 s: kept
    now["t"] += 1.0
    assert pool.end_step() == 24 * MiB and pool.reserved == 0
    capped = m.HostPool(limit=1 << 40, pin=False, keep_steps=1, chunk_bytes=4 * MiB,
                        keep_seconds=0.0, max_keep_seconds=50.0, clock=lambda: now["t"])
    capped.free(capped.alloc(4 * MiB))
    now["t"] += 1000.0
    capped.end_step()
    assert capped.end_step() == 4 * MiB
    capped.alloc(4 * MiB)                             # a need that recurs after 1000 s
    assert capped.keep_seconds == 50.0
    with pytest.raises(ValueError, match="keep_seconds"):
        m.HostPool(limit=1, pin=False, keep_seconds=-1)


def test_pool_cache_yields_to_host_memory_held_elsewhere(m):
    """Cached buffers give way to the eviction net's host copies under the shared limit:
    released at the next pool operation, least recently returned first, never a buffer
    in use."""
    held = {"n": 0}
    pool = m.HostPool(keep_seconds=0, limit=16 * MiB, pin=False, extra_fn=lambda: held["n"])
    a, b, c = (pool.alloc(4 * MiB) for _ in range(3))
    pool.free(a)
    pool.free(b)
    assert pool.reserved == 12 * MiB and pool.cached == 8 * MiB
    held["n"] = 8 * MiB                               # the net took 8 MiB: 20 > 16
    pool.free(c)                                      # the next operation trims
    assert pool.reserved + held["n"] <= pool.limit
    assert pool.reserved == 8 * MiB and pool.in_use == 0
    held["n"] = 16 * MiB
    assert pool.end_step() == 8 * MiB and pool.reserved == 0


def test_pool_limit_counts_bytes_still_being_given_back(m):
    """Buffers are unpinned and unmapped on the pool's thread; until they are gone they
    count against the limit, and an allocation that needs their room waits for them
    instead of failing or going over."""
    gate = threading.Event()
    pool = m.HostPool(keep_seconds=0, limit=8 * MiB, pin=False, keep_steps=1,
                      reserve_fn=lambda n: True, release_fn=lambda n: gate.wait(10))
    b = pool.alloc(8 * MiB)
    pool.free(b)
    del b
    assert pool.end_step() == 0
    assert pool.end_step() == 8 * MiB                 # aged out: queued for release
    assert pool.reserved == 0 and pool.stats()["host.releasing_bytes"] == 8 * MiB
    threading.Timer(0.3, gate.set).start()
    t0 = time.monotonic()
    pool.alloc(8 * MiB)                               # waits for the old buffer to go
    assert time.monotonic() - t0 >= 0.25
    assert pool.stats()["host.releasing_bytes"] == 0 and pool.reserved == 8 * MiB


class NetSide:
    """The eviction net's side of the pool's offers, as lms_swap_guard.cpp keeps it
    (offer / withdraw / take_discarded under one lock); ``give_back`` is what the net
    does when its copies would go over the host limit.  (The C++ side itself runs on a
    GPU: tests/conformance/lms_swap/test_lms_swap_guard.py.)"""

    def __init__(self):
        self.offers = {}
        self.discarded = []

    def offer(self, cid, ptr, size, device):
        assert cid not in self.offers and size > 0 and ptr and device == -1
        self.offers[cid] = size

    def withdraw(self, cid):
        return self.offers.pop(cid, None) is not None

    def take_discarded(self):
        out, self.discarded = self.discarded, []
        return out

    def give_back(self, nbytes, tell=True):
        """Gives back offered chunks, oldest first, until ``nbytes`` are freed."""
        freed = 0
        for cid in list(self.offers):
            if freed >= nbytes:
                break
            freed += self.offers.pop(cid)
            if tell:
                self.discarded.append(cid)
        return freed


def test_the_net_is_told_every_byte_the_pool_holds(m):
    seen = []
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, on_change=seen.append, chunk_bytes=4 * MiB)
    b = pool.alloc(4 * MiB)
    assert seen[-1] == 4 * MiB
    pool.free(b)
    pool.cached                                       # the free is taken in
    assert seen[-1] == 4 * MiB == pool.reserved       # idle, still held


def test_idle_chunks_are_the_nets_to_give_back(m):
    """A chunk nothing is carved from is offered to the net; the pool withdraws the offer
    before it carves from the chunk; a chunk the net gave back leaves the pool's books at
    its next operation and is never handed out again."""
    net, seen = NetSide(), []
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, net=net, on_change=seen.append,
                      chunk_bytes=4 * MiB)
    a, b = pool.alloc(4 * MiB), pool.alloc(4 * MiB)
    assert net.offers == {}                           # carved: not offered
    pool.free(a)
    pool.free(b)
    pool.cached
    assert len(net.offers) == 2
    ptrs = {a.data_ptr(), b.data_ptr()}
    del a, b
    c = pool.alloc(4 * MiB)                           # reuses one: its offer withdrawn
    assert len(net.offers) == 1 and pool.misses == 2 and c.data_ptr() in ptrs
    assert net.give_back(1) == 4 * MiB                # the net needed room
    d = pool.alloc(4 * MiB)                           # books first: a new mapping
    st = pool.stats()
    assert st["host.net_discards"] == 1 and pool.misses == 3
    assert pool.reserved == 8 * MiB == seen[-1] and pool.in_use == 8 * MiB
    pool.free(c)
    pool.free(d)
    del c, d
    assert pool.empty_cache() == 8 * MiB and net.offers == {} and pool.reserved == 0


def test_the_nets_count_of_bytes_being_given_back_survives_a_second_pool(m):
    """Every swapper's pool installs the net's hook on the one releaser: installed again
    while bytes are pending, the net must not count them twice (it would refuse room
    that exists)."""
    releaser = importlib.import_module(m.__name__ + ".pinned").releaser
    gate, total = threading.Event(), {"n": 0}

    def hook(delta):
        total["n"] += delta

    old = releaser.on_pending
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, keep_steps=1, chunk_bytes=4 * MiB,
                      reserve_fn=lambda n: True, release_fn=lambda n: gate.wait(10))
    try:
        b = pool.alloc(4 * MiB)
        pool.free(b)
        del b
        pool.end_step()
        assert pool.end_step() == 4 * MiB and releaser.pending == 4 * MiB
        releaser.set_on_pending(hook)
        releaser.set_on_pending(hook)                # a second pool, the same net
        assert total["n"] == 4 * MiB
        gate.set()
        pool.wait_released()
        assert total["n"] == 0
    finally:
        gate.set()
        releaser.set_on_pending(old)


def test_a_chunk_given_back_unseen_is_dropped_when_the_pool_reaches_for_it(m):
    """The net may give a chunk back after the pool last asked: withdrawing then fails,
    and the pool drops the chunk instead of carving from it or releasing it again."""
    net = NetSide()
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, net=net, keep_steps=1, chunk_bytes=4 * MiB)
    a = pool.alloc(4 * MiB)
    pool.free(a)
    del a
    pool.cached
    net.give_back(1, tell=False)
    b = pool.alloc(1 * MiB)
    assert pool.stats()["host.net_discards"] == 1 and pool.misses == 2
    assert pool.reserved == 4 * MiB
    pool.free(b)
    del b
    pool.cached
    net.give_back(1, tell=False)
    pool.end_step()
    assert pool.end_step() == 4 * MiB and pool.reserved == 0
    assert pool.stats()["host.net_discards"] == 2 and pool.stats()["host.releasing_bytes"] == 0


def test_pool_reuses_its_hot_buffers_and_lets_the_rest_age_out(m):
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, keep_steps=2, chunk_bytes=4 * MiB)
    bufs = [pool.alloc(4 * MiB) for _ in range(3)]    # one step held three at once
    for b in bufs:
        pool.free(b)
    del bufs, b
    pool.end_step()
    released = 0
    for _ in range(3):                                # later steps need one at a time
        b = pool.alloc(4 * MiB)
        pool.free(b)
        released += pool.end_step()
    assert pool.misses == 3                           # nothing pinned again
    assert released == 8 * MiB and pool.reserved == 4 * MiB
    with pytest.raises(ValueError, match="keep_steps"):
        m.HostPool(keep_seconds=0, limit=1, pin=False, keep_steps=0)


def _pin_check():
    sys.path.insert(0, str(REPO / "tests" / "conformance" / "lms_swap"))
    import pin_check
    return pin_check


def test_pin_check_fails_on_a_pageable_pool(m, monkeypatch):
    """The GPU suite's check that every host buffer of a CUDA swapper is pinned
    (tests/conformance/lms_swap/pin_check.py): a pool of pageable memory (pin=False) fails
    it at its first buffer, whole and in pieces; pinned buffers pass and are counted;
    swappers of device_type "cpu" are not checked."""
    pc = _pin_check()
    pool = pc.check_pool(m.HostPool(keep_seconds=0, limit=1 << 30, pin=False, chunk_bytes=4 * MiB))
    with pytest.raises(AssertionError, match="not pinned"):
        pool.alloc(1 * MiB)
    with pytest.raises(AssertionError, match="not pinned"):
        pool.alloc_pieces(6 * MiB)
    assert pool.pin_checks == 0
    ok = pc.check_pool(m.HostPool(keep_seconds=0, limit=1 << 30, pin=False, chunk_bytes=4 * MiB), is_pinned=lambda t: True)
    ok.alloc(1 * MiB)
    ok.alloc_pieces(6 * MiB)
    assert ok.pin_checks >= 3
    pc.check_cuda_swappers(m, monkeypatch)
    assert getattr(cpu_swapper(m).pool, "pin_checks", None) is None
    cuda_sw = m.ActivationSwapper(device_type="cuda", pool=m.HostPool(keep_seconds=0, limit=1 << 30, pin=False))
    with pytest.raises(AssertionError, match="not pinned"):
        cuda_sw.pool.alloc(1 * MiB)


def test_pool_limit_counts_host_memory_held_elsewhere(m):
    held = {"n": 6 * MiB}
    pool = m.HostPool(keep_seconds=0, limit=10 * MiB, pin=False, extra_fn=lambda: held["n"])
    pool.alloc(4 * MiB)
    with pytest.raises(m.LMSHostMemoryError, match="host memory limit"):
        pool.alloc(1 * MiB)
    held["n"] = 0
    pool.alloc(1 * MiB)
