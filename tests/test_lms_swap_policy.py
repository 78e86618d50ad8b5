"""CPU tests of LMS activation swapping (lms-swap/src/lms_swap/, placed by the patch as torch/cuda/lms_swap/).

No GPU needed: the host pool runs unpinned, and the swapper runs its whole pack / unpack /
prefetch / release machinery on CPU tensors (``device_type="cpu"``), with real torch
autograd.  The GPU behaviour (streams, pinned memory, bitwise equality on CUDA) is in
tests/conformance/lms_swap (marked gpu).
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
nn = torch.nn

REPO = pathlib.Path(__file__).resolve().parent.parent
MiB = 1 << 20


def cpu_swapper(m, **kw):
    kw.setdefault("policy", "always")
    kw.setdefault("size_threshold", 4096)
    kw.setdefault("host_limit", 256 * MiB)
    kw.setdefault("host_min_available", 0)
    return m.ActivationSwapper(device_type="cpu", **kw)


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
    m.copies._copy_into_pieces(pieces, src, non_blocking=False)
    back = torch.empty_like(src)
    m.copies._copy_from_pieces(back, pieces, non_blocking=False)
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

    _equal(train(contextlib.nullcontext), train(lambda: sw))
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


# ------------------------------------------------------------------ policy
def test_config_validation(m):
    with pytest.raises(TypeError, match="unknown LMS swap option 'prefetch'"):
        m.SwapConfig(prefetch=3)
    with pytest.raises(ValueError, match="policy"):
        m.SwapConfig(policy="sometimes")
    with pytest.raises(ValueError, match="prefetch_depth"):
        m.SwapConfig(prefetch_depth=-1)
    with pytest.raises(ValueError, match="device_limit_fraction"):
        m.SwapConfig(device_limit_fraction=1.5)
    assert m.SwapConfig().size_threshold == MiB


def test_ranks_on_a_node_share_its_host_memory(m, monkeypatch):
    monkeypatch.delenv(m.ENV_HOST_LIMIT, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    one, _ = m.ActivationSwapper()._host_limits()
    assert one == int(m._host_total() * 0.80)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")          # torchrun, 4 ranks on this node
    assert m.local_world_size() == 4
    assert m.ActivationSwapper()._host_limits()[0] == one // 4
    monkeypatch.setenv(m.ENV_HOST_LIMIT, "1024")         # an explicit limit is per process
    assert m.ActivationSwapper()._host_limits()[0] == 1024 * MiB
    for bad in ("0", "-2", "x", ""):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        assert m.local_world_size() == 1


def test_host_limit_error_names_the_rank_under_torchrun(m, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    pool = m.HostPool(keep_seconds=0, limit=4 * MiB, pin=False)
    with pytest.raises(m.LMSHostMemoryError) as e:
        pool.alloc(8 * MiB)
    msg = str(e.value)
    assert m.ENV_HOST_LIMIT in msg and "rank 5, local rank 1 of 4" in msg and "per process" in msg
    monkeypatch.delenv("RANK")
    with pytest.raises(m.LMSHostMemoryError) as e:
        pool.alloc(8 * MiB)
    assert "rank" not in str(e.value)


def test_threshold_env(m, monkeypatch):
    monkeypatch.setenv("PYTORCH_LMS_SWAP_THRESHOLD_IN_KB", "64")
    assert m.SwapConfig().size_threshold == 64 * 1024


def test_pressure_rule_and_margin_learning(m):
    G = 1 << 30
    # limit 76 GiB, margin 4: swap above 72
    assert m.swap_trigger(76 * G, 4 * G) == 72 * G
    # 71 GiB allocated (the 2 GiB tensor included) + 2 GiB for the next output > 72
    assert m.should_swap(2 * G, 71 * G, 76 * G, 4 * G)
    assert not m.should_swap(2 * G, 60 * G, 76 * G, 4 * G)
    assert m.should_swap(2 * G, 70 * G, 76 * G, 4 * G) is False  # exactly at the line
    # backward allocated 6 GiB above the end of forward
    assert m.learn_margin(60 * G, 50 * G, 66 * G, G // 2) == int(6 * G * 1.05)
    assert m.learn_margin(60 * G, 70 * G, 59 * G, G // 2) == G // 2  # floor


def test_margin_factor_learning(m):
    G = 1 << 30
    f = m.next_margin_factor
    # first step: backward set a new peak 8 GiB over forward's end
    k = f(None, 2 * G, 70 * G, 60 * G, 78 * G, G // 2)
    assert k == pytest.approx(8 * 1.05 / 2, rel=1e-6)
    # a new peak measures exactly: the factor follows it up ...
    assert f(1.0, 2 * G, 70 * G, 60 * G, 78 * G, G // 2) == pytest.approx(4.2, rel=1e-6)
    # ... and down
    assert f(9.0, 2 * G, 70 * G, 60 * G, 78 * G, G // 2) == pytest.approx(4.2, rel=1e-6)
    # no new peak: the old peak only bounds this step from above, never raises k
    assert f(1.0, 2 * G, 60 * G, 78 * G, 78 * G, G // 2) == 1.0
    assert f(20.0, 2 * G, 60 * G, 78 * G, 78 * G, G // 2) == pytest.approx(18 * 1.05 / 2, rel=1e-6)
    # backward that needs nothing keeps min_margin
    assert f(None, 2 * G, 70 * G, 70 * G, 70 * G + 1, G // 2) == pytest.approx(0.25)
    # ... or min_factor times the largest tensor, whichever is more
    assert f(None, 2 * G, 70 * G, 70 * G, 70 * G + 1, G // 2, 1.0) == 1.0
    assert f(3.0, 2 * G, 70 * G, 60 * G, 72 * G, G // 2, 1.0) == pytest.approx(1.05)


def test_reserve_factor_learning(m):
    G = 1 << 30
    f = m.next_reserve_factor
    assert f(3.0, 70 * G, 78 * G) == 3.0                    # under the limit: unchanged
    assert f(3.0, 79 * G, 78 * G) == pytest.approx(3.75)    # over it: a quarter more
    assert f(7.9, 79 * G, 78 * G) == 8.0                    # capped


def test_slack_grows_only_from_steps_that_moved_memory_and_hit_the_edge(m):
    GiB, MiB = 1 << 30, 1 << 20
    limit = 64 * GiB
    big = limit // 16  # moved a 16th of the limit: well past a batch stock trains
    assert m.next_slack(0, released=True, swapped=big, limit=limit) == GiB  # a 64th
    assert m.next_slack(0, released=True, swapped=0, limit=limit) == 0  # stock's own
    assert m.next_slack(0, released=True, swapped=big - 1, limit=limit) == 0  # near 1.0x
    assert m.next_slack(0, released=False, swapped=big, limit=limit) == 0
    assert m.next_slack(3 * GiB, released=False, swapped=big, limit=limit) == 3 * GiB
    assert m.next_slack(0, True, GiB, limit=4 * GiB) == 256 * MiB  # at least 256 MiB
    s = 0
    for _ in range(100):
        s = m.next_slack(s, True, big, limit)
    assert s == limit // 16  # capped


def test_plan_learning(m):
    G = 1 << 30
    # swapped nothing, forward ended 3 GiB above the trigger: plan 3 GiB (+ slack)
    assert m.next_plan(0, 73 * G, 70 * G, G // 2) == 3 * G + G // 2
    # swapped 20 GiB and ended 5 GiB under the trigger: 15 GiB would have done
    assert m.next_plan(20 * G, 65 * G, 70 * G, G // 2) == 15 * G + G // 2
    # far under the trigger: nothing
    assert m.next_plan(1 * G, 40 * G, 70 * G, G // 2) == 0
    # steady state: the plan reproduces itself
    p = m.next_plan(10 * G, 70 * G - G // 2, 70 * G, G // 2)
    assert p == 10 * G


def test_plan_follows_forward_peak_where_it_is_nearer_its_bound(m):
    G = 1 << 30
    # a decoder: forward ends 13 GiB under the trigger, but its loss peaked at the
    # allocator's capacity after the net had moved 8 GiB (in the 38 GiB moved): the
    # next forward swaps what the net moved from its start, and more slack
    assert m.next_plan(38 * G, 52 * G, 65 * G, G, peak_over=0) == 39 * G
    # the end alone would have lowered it below what this step had to move
    assert m.next_plan(38 * G, 52 * G, 65 * G, G) == 26 * G
    # a forward whose end is nearer its bound than its peak: the end decides
    assert m.next_plan(10 * G, 70 * G, 65 * G, G, peak_over=-2 * G) == 16 * G
    assert m.next_plan(0, 50 * G, 65 * G, G, peak_over=-20 * G) == 0


def test_net_evictions_in_forward_count_as_swapped_in_the_next_prediction(m):
    G = 1 << 30
    # forward read the allocation at 20 and 40 GiB saved; at its loss the net moved
    # 8 GiB; it ended at 52 GiB allocated with 30 GiB swapped
    off = [20 * G, 40 * G]
    growth = m.growth_to_end(off, [45 * G, 80 * G], 52 * G, 30 * G + 8 * G)
    # at the 40 GiB point (50 GiB allocated there) the next forward sees its end at
    # 60 GiB, not 52: what the net moved was forward's memory too
    assert m.predict_forward_end(50 * G, 40 * G, off, growth, 45 * G) == 60 * G


def test_tail_rule(m):
    G = 1 << 30
    # the previous forward saved 40 GiB; the largest saved tensor is 3 GiB
    assert m.in_tail(37 * G, 3 * G, 40 * G, 3 * G)          # the last tensor
    assert m.in_tail(36 * G, 2 * G, 40 * G, 3 * G)          # 2 GiB saved after it
    assert not m.in_tail(34 * G, 3 * G, 40 * G, 3 * G)      # 3 GiB after it: not the tail
    assert not m.in_tail(37 * G, 3 * G, None, 3 * G)        # first step: nothing known


def test_inflight_room(m):
    G = 1 << 30
    # a 78 GiB limit, 10 GiB the largest saved tensor, 60 GiB allocated
    assert m.inflight_room(78 * G, 10 * G, 60 * G, 0) == 8 * G       # at a kept tensor
    # the tensor being swapped is in the allocation and in the copies: counted once
    assert m.inflight_room(78 * G, 10 * G, 60 * G, 5 * G) == 13 * G
    # no room for the next allocation: every older copy must finish first
    assert m.inflight_room(78 * G, 10 * G, 70 * G, 0) == -2 * G


def test_forward_end_prediction(m):
    G = 1 << 30
    # the previous forward read the allocation at 10, 20 and 30 GiB saved; it swapped
    # 4 GiB in all and ended at 60 GiB allocated (64 GiB unswapped)
    off = [10 * G, 20 * G, 30 * G]
    growth = m.growth_to_end(off, [40 * G, 55 * G, 67 * G], 60 * G, 4 * G)
    assert growth == [24 * G, 9 * G, -3 * G]   # the last reading had 3 GiB of transients
    p = m.predict_forward_end
    assert p(50 * G, 25 * G, off, growth, 32 * G) == 59 * G   # the reading at 20 GiB
    assert p(68 * G, 30 * G, off, growth, 32 * G) == 65 * G   # transients end
    assert p(50 * G, 5 * G, off, growth, 32 * G) is None      # before the first reading
    assert p(50 * G, 33 * G, off, growth, 32 * G) is None     # longer than the last step
    assert p(50 * G, 25 * G, off, growth, None) is None       # first step


def test_dense_span(m):
    f = m._dense_span
    x = torch.empty(4, 3, 8, 8)
    assert f(x) and f(x.to(memory_format=torch.channels_last))
    assert f(x.transpose(0, 1)) and f(x.permute(3, 1, 0, 2))
    assert not f(x[:, :, ::2]) and not f(x[:, 1:])
    assert not f(torch.empty(1, 8).expand(4, 8))
    assert f(torch.empty(4, 1, 8)[:, :, :])


# ------------------------------------------------------------------ autograd on CPU tensors
def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Flatten(), nn.Linear(8 * 16 * 16, 10),
    ).to(memory_format=torch.channels_last)


def _train(ctx, steps=2, retain=False):
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=g).to(memory_format=torch.channels_last)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        with ctx():
            loss = model(x).square().mean()
        loss.backward(retain_graph=retain)
        if retain:
            loss.backward()
        out.append(loss.detach())
        out += [p.grad.clone() for p in model.parameters()]
        opt.step()
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_swap_roundtrip_is_bitwise(m):
    sw = cpu_swapper(m, prefetch_depth=2)
    _equal(_train(contextlib.nullcontext), _train(lambda: sw))
    s = sw.stats()
    assert s["swap.out_count"] > 0 and s["swap.in_bytes"] == s["swap.out_bytes"]
    assert s["swap.dedupe_hits"] >= 2          # ReLU(inplace) outputs saved twice
    assert s["swap.prefetched"] > 0 and s["swap.prefetch_hits"] > 0
    assert s["host.in_use_bytes"] == 0         # everything returned after backward
    assert s["host.pool_hits"] > 0             # second step reuses the buffers


def test_policy_never_and_threshold(m):
    sw = cpu_swapper(m, policy="never")
    _equal(_train(contextlib.nullcontext), _train(lambda: sw))
    assert sw.stats()["swap.out_count"] == 0
    sw = cpu_swapper(m, size_threshold=1 << 40)
    _train(lambda: sw)
    s = sw.stats()
    assert s["swap.out_count"] == 0 and s["swap.small_count"] > 0


def test_auto_policy_swaps_only_past_the_limit(m):
    # CPU mode reads the allocation as 0: a trigger (limit - margin) below 0 means pressure
    sw = cpu_swapper(m, policy="auto", device_limit=1 << 40, margin=0, adaptive_margin=False)
    _train(lambda: sw)
    assert sw.stats()["swap.out_count"] == 0
    sw = cpu_swapper(m, policy="auto", device_limit=1, margin=2, adaptive_margin=False)
    _equal(_train(contextlib.nullcontext), _train(lambda: sw))
    assert sw.stats()["swap.out_count"] > 0


def _pressure_everywhere(m, **kw):
    # CPU mode reads the allocation as 0: limit 1 GiB and margin 1 GiB - 1 make every
    # tensor cross the trigger while the allocation stays under the limit
    return cpu_swapper(m, policy="auto", device_limit=1 << 30, margin=(1 << 30) - 1,
                       adaptive_margin=False, **kw)


def test_tail_is_kept_from_the_second_step(m):
    sw = _pressure_everywhere(m)
    ref = _train(contextlib.nullcontext, steps=1)
    _equal(ref, _train(lambda: sw, steps=1))
    s1 = sw.stats()
    assert s1["swap.tail_kept"] == 0 and s1["swap.kept_count"] == 0  # nothing learned yet
    sw.reset_stats()
    model_steps = _train(lambda: sw, steps=2)   # the swapper knows a forward now
    s2 = sw.stats()
    assert s2["swap.tail_kept"] >= 1 and s2["swap.out_count"] > s2["swap.tail_kept"]
    _equal(_train(contextlib.nullcontext, steps=2), model_steps)


def test_full_swap_space_keeps_tensors_under_the_limit(m):
    sw = _pressure_everywhere(m, host_limit=32 * 1024)
    _equal(_train(contextlib.nullcontext), _train(lambda: sw))
    s = sw.stats()
    assert s["swap.host_full_kept"] > 0 and s["host.reserved_bytes"] <= 32 * 1024
    # with no room on the device either, the host error stands
    sw = cpu_swapper(m, policy="auto", device_limit=1, margin=2, adaptive_margin=False,
                     host_limit=32 * 1024)
    with pytest.raises(m.LMSHostMemoryError, match="host swap space exhausted"):
        _train(lambda: sw)
    gc.collect()
    assert sw.stats()["host.in_use_bytes"] == 0


def test_retain_graph(m):
    sw = cpu_swapper(m)
    _equal(_train(contextlib.nullcontext, retain=True), _train(lambda: sw, retain=True))
    s = sw.stats()
    assert s["swap.in_bytes"] >= 2 * s["swap.out_bytes"] > 0


def test_views_and_inplace_detection(m):
    sw = cpu_swapper(m)

    def run(ctx):
        torch.manual_seed(0)
        a = torch.randn(64, 64, requires_grad=True)
        with ctx():
            b = a * 1.0
            loss = ((b.t() @ b).sin().sum() + (b[:, ::2] ** 2).sum()
                    + (b.unsqueeze(0).expand(3, -1, -1) * b).sum())
        loss.backward()
        return [loss.detach(), a.grad]

    _equal(run(contextlib.nullcontext), run(lambda: sw))
    assert sw.stats()["swap.not_dense_kept"] >= 1

    a = torch.randn(64, 64, requires_grad=True)
    with sw:
        b = a * 2
        c = b.exp()  # saves its result
        c.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def test_checkpoint_and_no_grad(m):
    from torch.utils.checkpoint import checkpoint

    sw = cpu_swapper(m)
    lin = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128))

    def run(ctx, reentrant):
        for p in lin.parameters():
            p.grad = None
        x = torch.randn(64, 128, generator=torch.Generator().manual_seed(2), requires_grad=True)
        with ctx():
            y = checkpoint(lin, x, use_reentrant=reentrant).tanh() * x
        y.sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in lin.parameters()]

    for reentrant in (False, True):
        _equal(run(contextlib.nullcontext, reentrant), run(lambda: sw, reentrant))
    before = sw.stats()["swap.out_count"]
    with torch.no_grad(), sw:
        lin(torch.randn(64, 128))
    assert sw.stats()["swap.out_count"] == before


def test_exception_mid_forward_returns_host_memory(m):
    sw = cpu_swapper(m)
    model = _net()
    x = torch.randn(8, 3, 16, 16)
    for _ in range(3):
        with pytest.raises(ZeroDivisionError):
            with sw:
                h = model[:5](x)
                1 / 0
    del h
    gc.collect()
    s = sw.stats()
    assert s["swap.out_count"] > 0 and s["host.in_use_bytes"] == 0
    assert s["host.pool_misses"] < s["swap.out_count"]  # later attempts reused buffers
    assert sw.empty_cache() == s["host.reserved_bytes"]


def test_host_limit_error_during_forward(m):
    sw = cpu_swapper(m, host_limit=32 * 1024)
    with pytest.raises(m.LMSHostMemoryError, match="host swap space exhausted"):
        with sw:
            _net()(torch.randn(8, 3, 16, 16))
    gc.collect()
    assert sw.stats()["host.in_use_bytes"] == 0


def test_module_level_enable_disable(m):
    m.configure(device_type="cpu", policy="always", size_threshold=4096,
                host_limit=256 * MiB, host_min_available=0)
    try:
        ref = _train(contextlib.nullcontext)
        m.reset_stats()
        m.enable()
        m.enable()  # idempotent
        assert m.is_enabled()
        out = _train(contextlib.nullcontext)
        m.disable()
        assert not m.is_enabled()
        _equal(ref, out)
        assert m.stats()["swap.out_count"] > 0
        with m.swapping():
            _train(contextlib.nullcontext, steps=1)
    finally:
        m.disable()
        m.configure(device_type="cuda", policy="auto", size_threshold=MiB,
                    host_limit=None, host_min_available=None)
        m.empty_cache()


def test_trace_records_events(m):
    sw = cpu_swapper(m, trace=True)
    _train(lambda: sw, steps=1)
    events = {e[1] for e in sw.trace()}
    assert {"out", "in"} <= events


# ------------------------------------------------------------------ no collapse, memory back
def test_learning_is_damped_downwards_only(m):
    assert m.damped(4.4, None) == 4.4                 # nothing learned yet
    assert m.damped(4.4, 27.0) == 13.5                # one odd step: at most half
    assert m.damped(30.0, 27.0) == 30.0               # raising is never damped
    plan, steps = 24.4, 0
    while plan > 1.0:                                 # a plan that is no longer needed
        plan, steps = m.damped(0.0, plan), steps + 1  # still goes, in a few steps
    assert steps == 5


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
    _releaser = importlib.import_module(m.__name__ + ".pinned")._releaser
    gate, total = threading.Event(), {"n": 0}

    def hook(delta):
        total["n"] += delta

    old = _releaser.on_pending
    pool = m.HostPool(keep_seconds=0, limit=1 << 40, pin=False, keep_steps=1, chunk_bytes=4 * MiB,
                      reserve_fn=lambda n: True, release_fn=lambda n: gate.wait(10))
    try:
        b = pool.alloc(4 * MiB)
        pool.free(b)
        del b
        pool.end_step()
        assert pool.end_step() == 4 * MiB and _releaser.pending == 4 * MiB
        _releaser.set_on_pending(hook)
        _releaser.set_on_pending(hook)                # a second pool, the same net
        assert total["n"] == 4 * MiB
        gate.set()
        pool.wait_released()
        assert total["n"] == 0
    finally:
        gate.set()
        _releaser.set_on_pending(old)


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


def test_eviction_net_without_cuda_warns_and_swapping_goes_on(m, monkeypatch):
    """Where the net cannot be built (here: no CUDA) swapping runs on its forecast alone,
    says so once, and reports the net inactive; ``required=True`` raises instead."""
    monkeypatch.setattr(m.guard, "_guard_state", {})
    monkeypatch.setattr(m.torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="eviction net not built"):
        assert m.load_guard() is None
    assert m.load_guard() is None            # decided once: no second warning, no rebuild
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        m.load_guard(required=True)
    sw = cpu_swapper(m)
    assert sw._guard() is None               # device_type="cpu": never asked for
    assert sw.stats()["guard.active"] == 0


def _varied_steps(ctx):
    """Steps that vary as training does: sequence length, an eval pass with and without
    autograd between steps, gradient accumulation over two micro-batches, a short last
    batch.  Returns the losses and the final weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    for seq, micro, batch in ((16, 1, 8), (48, 1, 8), (32, 2, 8), (8, 1, 8), (40, 1, 3)):
        opt.zero_grad(set_to_none=True)
        for _ in range(micro):
            x = torch.randn(batch, seq, 64, generator=g)
            with ctx():
                loss = model(x).pow(2).mean() / micro
            loss.backward()
            losses.append(loss.detach())
        opt.step()
        with torch.no_grad():                  # eval without autograd
            losses.append(model(torch.randn(2, seq, 64, generator=g)).sum())
        with ctx():                            # eval with autograd, no backward
            losses.append(model(torch.randn(2, seq, 64, generator=g)).sum().detach())
    return losses, [p.detach().clone() for p in model.parameters()]


def _varied_steps_swapper(m, policy):
    if policy == "auto":   # limit and margin that put every step past auto's trigger
        return _pressure_everywhere(m, prefetch_depth=2)
    return cpu_swapper(m, policy=policy, prefetch_depth=2)


@pytest.mark.parametrize("policy", ["always", "auto"])
def test_steps_that_vary_train_bitwise_and_return_host_memory(m, policy):
    sw = _varied_steps_swapper(m, policy)
    ref_losses, ref_params = _varied_steps(contextlib.nullcontext)
    losses, params = _varied_steps(lambda: sw)
    s = sw.stats()
    # the bitwise check below compares swapped runs with stock ones only if tensors did
    # go to host memory and come back, in every policy
    assert s["swap.out_count"] > 0 and s["swap.in_count"] > 0, {k: v for k, v in s.items() if k.startswith("swap.")}
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    gc.collect()
    s = sw.stats()
    assert s.get("host.in_use_bytes", 0) == 0  # the eval graphs without backward too


class _CountingNet:
    """Stands in for the eviction net's one counter the first-step rule reads (the net
    itself is C++ under the CUDA allocator: tests/conformance/lms_swap)."""

    def __init__(self):
        self.moved = 0

    def evicted_bytes(self):
        return self.moved


def test_eviction_net_build_names_missing_cuda_headers(m, monkeypatch, tmp_path):
    """PyTorch's CUDA wheels bring cuda_runtime_api.h (NVIDIA's runtime wheel) but not the
    crt/ headers it includes: the build says what to install instead of a compiler error."""
    (tmp_path / "cuda_runtime_api.h").write_text("/* runtime wheel */\n")
    monkeypatch.setattr(m.guard, "cuda_include_dirs", lambda: [str(tmp_path)])
    # the message names the wheel of the installed torch's CUDA: set here, so that it is the same
    # with a CPU torch (bookworm's local wheel) and a CUDA 12 or 13 one (PyPI's on Python 3.13)
    monkeypatch.setattr(m.torch.version, "cuda", "12.4")
    with pytest.raises(RuntimeError, match=r"crt/host_defines.h not found.*nvidia-cuda-nvcc-cu12"):
        m.build_guard()
    monkeypatch.setattr(m.torch.version, "cuda", "13.0")
    with pytest.raises(RuntimeError, match=r"crt/host_defines.h not found.*nvidia-cuda-crt` of CUDA 13.0"):
        m.build_guard()
    monkeypatch.setattr(m.guard, "cuda_include_dirs", lambda: [])
    with pytest.raises(RuntimeError, match="cuda_runtime_api.h not found"):
        m.build_guard()


def test_first_step_margin_with_the_net_waits_for_its_first_eviction(m):
    """With the net, the first step keeps only min_margin (a step that fits swaps
    nothing); once the net has had to move something, the step keeps the no-net share;
    the learned margin has no floor of one tensor."""
    net = _CountingNet()
    sw = cpu_swapper(m, policy="auto", min_margin=64 * MiB)
    sw._guard = lambda: net
    st = m._DevState(None)
    st.largest = 32 * MiB
    assert sw._margin(st) == 64 * MiB
    assert sw._min_margin_factor() == 0.0
    net.moved += 96 * MiB  # the net caught an out-of-memory error in this phase
    assert sw._margin(st) == max(5 * 32 * MiB, int(0.35 * sw._device_limit(st)))
    assert sw.configure(first_margin_fraction=0.1) and sw._margin(st) > 64 * MiB


def test_without_the_net_the_first_step_keeps_its_share(m):
    sw = cpu_swapper(m, policy="auto", min_margin=64 * MiB)
    assert sw._guard() is None
    st = m._DevState(None)
    st.largest = 32 * MiB
    assert sw._margin(st) == max(5 * 32 * MiB, int(0.35 * sw._device_limit(st)))
    assert sw._min_margin_factor() == 1.0
    with pytest.raises(ValueError, match="first_margin_fraction"):
        m.SwapConfig(first_margin_fraction=1.0)


def test_a_harmless_step_takes_back_the_plan_it_raised(m):
    """The plan is raised at forward's end, on a forecast of backward's need; a step whose
    backward then needed neither the net nor a cache release proved what it swapped was
    enough.  (Raised anyway, a checkpointed Llama at 1.5x on the H100 swapped 54.7 and
    26.4 GB in turns, the smaller amount harmless at stock's speed.)"""
    settled = m.policy.settled_plan
    G = 1 << 30
    assert settled(55 * G, 27 * G, 26 * G, harmless=True) == 27 * G    # back to the start
    assert settled(55 * G, 27 * G, 30 * G, harmless=True) == 30 * G    # or what it swapped
    assert settled(55 * G, 27 * G, 26 * G, harmless=False) == 55 * G   # the net was needed
    assert settled(20 * G, 27 * G, 26 * G, harmless=True) == 20 * G    # lowering stands
