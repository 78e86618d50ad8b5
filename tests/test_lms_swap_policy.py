"""CPU tests of LMS activation swapping's policy (lms-swap/src/lms_swap/, placed by the patch as
torch/cuda/lms_swap/): its settings, what it learns from a step (margin, slack, plan, tail) and
the first step's rule with and without the eviction net.  The host pool's tests are in
test_lms_swap_host_pool.py, the swapper's on real autograd in test_lms_swap_autograd.py; the GPU
behaviour in tests/conformance/lms_swap (marked gpu).
"""
from __future__ import annotations

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip

from tests.lms_swap_cpu import MiB, cpu_swapper


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
    assert one == int(m.host_total() * 0.80)
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


def test_a_forward_the_net_rescued_never_lowers_the_plan(m):
    G = 1 << 30
    # the net moved 1 GiB for the logits; the running peak, which never saw the failed
    # request, reads 2 GiB under the capacity: the next forward still swaps all 18 GiB
    # this one and the net moved, and the slack
    assert m.next_plan(18 * G, 60 * G, 65 * G, G // 2, peak_over=-2 * G,
                       rescued=True) == 18 * G + G // 2
    assert m.next_plan(18 * G, 60 * G, 65 * G, G // 2, peak_over=-2 * G) == 16 * G + G // 2
    # over the capacity reads as it is
    assert m.next_plan(18 * G, 60 * G, 65 * G, G // 2, peak_over=G, rescued=True) == 19 * G + G // 2


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
    f = m.dense_span
    x = torch.empty(4, 3, 8, 8)
    assert f(x) and f(x.to(memory_format=torch.channels_last))
    assert f(x.transpose(0, 1)) and f(x.permute(3, 1, 0, 2))
    assert not f(x[:, :, ::2]) and not f(x[:, 1:])
    assert not f(torch.empty(1, 8).expand(4, 8))
    assert f(torch.empty(4, 1, 8)[:, :, :])


# ------------------------------------------------------------------ no collapse, memory back
def test_learning_is_damped_downwards_only(m):
    assert m.damped(4.4, None) == 4.4                 # nothing learned yet
    assert m.damped(4.4, 27.0) == 13.5                # one odd step: at most half
    assert m.damped(30.0, 27.0) == 30.0               # raising is never damped
    plan, steps = 24.4, 0
    while plan > 1.0:                                 # a plan that is no longer needed
        plan, steps = m.damped(0.0, plan), steps + 1  # still goes, in a few steps
    assert steps == 5


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
    from lms_swap.forecast import StepForecast
    net = _CountingNet()
    sw = cpu_swapper(m, policy="auto", min_margin=64 * MiB)
    forecast = StepForecast(sw.config, guard=lambda: net, allocated_of=lambda st: 0)
    st = m.DevState(None)
    st.largest = 32 * MiB
    assert forecast.margin(st) == 64 * MiB
    assert forecast.min_margin_factor() == 0.0
    net.moved += 96 * MiB  # the net caught an out-of-memory error in this phase
    assert forecast.margin(st) == max(5 * 32 * MiB, int(0.35 * forecast.limit(st)))
    assert sw.configure(first_margin_fraction=0.1) and forecast.margin(st) > 64 * MiB


def test_without_the_net_the_first_step_keeps_its_share(m):
    sw = cpu_swapper(m, policy="auto", min_margin=64 * MiB)
    assert sw._guard() is None
    st = m.DevState(None)
    st.largest = 32 * MiB
    forecast = sw._forecast
    assert forecast.margin(st) == max(5 * 32 * MiB, int(0.35 * forecast.limit(st)))
    assert forecast.min_margin_factor() == 1.0
    with pytest.raises(ValueError, match="first_margin_fraction"):
        m.SwapConfig(first_margin_fraction=1.0)


def test_releases_a_larger_swap_had_too_are_not_the_smaller_plans_harm(m):
    """releases_persist: a step's cache releases count as harm of its smaller plan only
    where the step before it (same shape, no net) swapped more and released less."""
    persist = m.policy.releases_persist
    G = 1 << 30
    assert persist(72 * G, 1, (90 * G, 1))         # the larger swap released as often
    assert persist(72 * G, 1, (90 * G, 3))
    assert not persist(72 * G, 2, (90 * G, 1))     # more releases than the larger swap had
    assert not persist(72 * G, 1, (90 * G, 0))     # the larger swap spared them
    assert not persist(90 * G, 1, (72 * G, 1))     # the step before swapped less
    assert not persist(72 * G, 1, (72 * G, 1))
    assert not persist(72 * G, 1, None)            # another shape, or the net helped it
    assert not persist(72 * G, 0, (90 * G, 1))     # nothing released: nothing to excuse


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
