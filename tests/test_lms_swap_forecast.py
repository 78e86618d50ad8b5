"""The objects the swapper owns besides its copy pacer, each on its own on CPU: the step
forecast (lms_swap.forecast.StepForecast) with a stand-in eviction net and allocation readings,
and backward's copies in (lms_swap.prefetch.Prefetcher) with a stand-in forecast; and the
swapper's statistics, which report the counts of each."""
from __future__ import annotations

import types
import weakref

import pytest
import torch

from tests.lms_swap_cpu import MiB, cpu_swapper


class _Net:
    """Stands in for the eviction net's counter of evicted bytes."""

    def __init__(self):
        self.moved = 0

    def evicted_bytes(self):
        return self.moved


def test_the_forecast_counts_what_the_net_moved_once_per_phase(m):
    from lms_swap.forecast import StepForecast
    net = _Net()
    forecast = StepForecast(m.SwapConfig(device_type="cpu", policy="auto"), guard=lambda: net,
                            allocated_of=lambda st: 0)
    st = m.DevState(None)
    st.saved, st.planned, st.rec_off = 5 * MiB, MiB, [0]
    net.moved = 3 * MiB                     # the net moved 3 MiB in forward
    forecast.begin_backward(st)
    assert st.fwd_evicted == 3 * MiB and st.prev_saved == 5 * MiB
    assert forecast.counts["guard_forward_bytes"] == 3 * MiB
    net.moved += 2 * MiB                    # ... and 2 in backward
    forecast.begin_forward(st)
    assert forecast.counts["guard_backward_bytes"] == 2 * MiB
    assert (st.saved, st.planned, st.fwd_evicted, st.rec_off) == (0, 0, 0, [])
    forecast.begin_backward(st)             # nothing moved since
    assert forecast.counts["guard_forward_bytes"] == 3 * MiB and st.fwd_evicted == 0
    forecast.reset()
    assert not forecast.counts


class _Net2(_Net):
    """... and the rest of what the forecast asks the net on a device."""

    def released(self, index):
        return 0

    def mark_peak(self, index):
        pass

    def peak_growth(self, index):
        return 0


def _first_save(forecast, st, level, base):
    """A forward of the same shape begins with ``base`` bytes on the device."""
    level["now"] = base
    forecast.enter_profile(st, torch.empty(4, 8))


@pytest.fixture
def forecast_after_a_taught_step(m):
    """A forecast whose shape was taught a 10 MiB plan by a step that began at 20 MiB."""
    from lms_swap.forecast import StepForecast
    net, level = _Net2(), {"now": 0}
    forecast = StepForecast(m.SwapConfig(device_type="cpu", policy="auto",
                                         device_limit=100 * MiB),
                            guard=lambda: net, allocated_of=lambda st: level["now"])
    st = m.DevState(0)
    _first_save(forecast, st, level, 20 * MiB)
    st.plan, st.taught_base = 10 * MiB, 20 * MiB
    return forecast, st, net, level


def test_a_dropped_forward_the_net_rescued_teaches_the_forwards_above_the_base(
        m, forecast_after_a_taught_step):
    """An evaluation pass with autograd on, with the last step's gradients on the device
    (3 MiB), swaps the plan and the difference and still needs the net (2 MiB): the next
    such pass of its shape swaps those 2 MiB too, and the training steps keep their plan."""
    forecast, st, net, level = forecast_after_a_taught_step
    forecast.begin_forward(st)
    _first_save(forecast, st, level, 23 * MiB)        # the pass begins above the base
    assert st.base_extra == 3 * MiB
    net.moved += 2 * MiB                              # ... and the net rescues it
    forecast.begin_forward(st, abandoned=True)        # dropped without a backward
    assert forecast.counts["guard_forward_bytes"] == 2 * MiB
    assert forecast.counts["guard_backward_bytes"] == 0
    assert forecast.counts["abandoned_rescues"] == 1
    assert st.plan == 10 * MiB and st.above_base_pad == 2 * MiB
    _first_save(forecast, st, level, 20 * MiB)        # a training step: its plan alone
    assert st.base_extra == 0 and st.plan == 10 * MiB
    forecast.begin_forward(st)
    _first_save(forecast, st, level, 23 * MiB)        # the next such pass
    assert st.base_extra == 5 * MiB


def test_a_dropped_forward_the_net_rescued_at_the_base_raises_the_plan(
        m, forecast_after_a_taught_step):
    forecast, st, net, level = forecast_after_a_taught_step
    forecast.begin_forward(st)
    _first_save(forecast, st, level, 20 * MiB)
    net.moved += 2 * MiB
    forecast.begin_forward(st, abandoned=True)
    assert st.plan == 12 * MiB and not st.above_base_pad
    forecast.begin_forward(st, abandoned=True)        # nothing moved since: nothing learned
    assert st.plan == 12 * MiB and forecast.counts["abandoned_rescues"] == 1


class _ReleasingNet(_Net2):
    """... whose caching allocator released its cache once a step, whatever was swapped."""

    def __init__(self):
        super().__init__()
        self.releases = 0

    def released(self, index):
        return self.releases


@pytest.mark.parametrize("option", [True, False])
def test_a_release_every_step_keeps_no_raise_that_only_repeats_the_larger_swap(m, option):
    """Two steps of one shape, neither needing the net, each with one cache release: the
    first swapped 90 MiB, the second 72 MiB and then raised its plan to 82 MiB.  With
    ``settle_when_releases_persist`` the raise is taken back (swapping more had not spared
    the release); without it any release keeps it.  A step of another shape, or one after
    a step that swapped more without a release, keeps it either way."""
    from lms_swap.forecast import StepForecast
    net, level = _ReleasingNet(), {"now": 0}
    forecast = StepForecast(m.SwapConfig(device_type="cpu", policy="auto", device_limit=100 * MiB,
                                         adaptive_margin=False,
                                         settle_when_releases_persist=option),
                            guard=lambda: net, allocated_of=lambda st: level["now"])
    st = m.DevState(0)

    def step(swapped, raised_to, released=1, shape=(4, 8)):
        forecast.enter_profile(st, torch.empty(*shape))
        st.planned, st.plan_before, st.plan = swapped, 68 * MiB, raised_to
        net.releases += released
        forecast.begin_forward(st)
        return st.plan

    step(90 * MiB, 68 * MiB)                                  # the larger swap, released once
    assert step(72 * MiB, 82 * MiB) == (72 * MiB if option else 82 * MiB)
    assert forecast.counts["plan_settled_past_releases"] == (1 if option else 0)
    assert step(72 * MiB, 82 * MiB) == 82 * MiB               # the step before swapped as much
    step(90 * MiB, 68 * MiB, released=0)                      # a larger swap spared the release
    assert step(72 * MiB, 82 * MiB) == 82 * MiB
    step(90 * MiB, 68 * MiB)
    assert step(72 * MiB, 82 * MiB, shape=(4, 16)) == 82 * MiB  # another shape
    assert forecast.counts["plan_settled_past_releases"] == (1 if option else 0)


class _Meter:
    """Stands in for a pluggable allocator's running peak (no eviction net): the level
    the allocator counts, its highest since the last mark, and nothing released."""

    def __init__(self):
        self.level = self.mark = self.peak = 0

    def to(self, level):
        self.level = level
        self.peak = max(self.peak, level)

    def mark_peak(self, index):
        self.mark = self.peak = self.level

    def peak_growth(self, index):
        return self.peak - self.mark

    def released(self, index):
        return 0


def test_without_the_net_an_allocators_running_peak_measures_each_backward(m):
    """Under a pluggable allocator (no net), backward's peak comes from the allocator's
    running peak, marked at backward's start: a step that swapped more and needed less
    lowers the margin to its own need.  The program's peak (the first step's 90 MiB) would
    have kept the margin where the first step left it."""
    from lms_swap.forecast import StepForecast
    meter = _Meter()
    forecast = StepForecast(m.SwapConfig(device_type="cpu", policy="auto",
                                         device_limit=100 * MiB, min_margin=MiB),
                            guard=lambda: None, allocated_of=lambda st: meter.level,
                            meter=lambda: meter)
    st = m.DevState(0)
    st.largest = 10 * MiB

    def step(forward_peak, forward_end, backward_peak):
        st.saved, st.rec_off = 40 * MiB, [0]
        meter.to(forward_peak)
        meter.to(forward_end)
        forecast.begin_backward(st)                 # marks the running peak
        meter.to(backward_peak)
        meter.to(0)
        forecast.begin_forward(st)                  # learns from the backward that ended

    step(90 * MiB, 60 * MiB, 80 * MiB)              # backward's own need: 20 MiB
    assert st.bwd_peak == 80 * MiB
    assert st.k == pytest.approx(20 * 1.05 / 10)
    step(50 * MiB, 30 * MiB, 45 * MiB)              # more swapped, 15 MiB needed
    assert st.bwd_peak == 45 * MiB
    assert st.k == pytest.approx(15 * 1.05 / 10)


def test_the_forecast_measures_by_the_nets_running_peak_where_it_is_armed(m):
    """With the net armed, its running peak is the one marked (no meter given)."""
    from lms_swap.forecast import StepForecast
    net = _Net2()
    forecast = StepForecast(m.SwapConfig(device_type="cpu", policy="auto"), guard=lambda: net,
                            allocated_of=lambda st: 0)
    assert forecast._meter() is net


def test_under_the_lms_allocator_the_swapper_builds_no_net_and_measures_by_its_peak(
        m, monkeypatch):
    """With the LMS pluggable allocator installed (its running peak given to
    device_memory), the swapper neither builds nor arms the eviction net, which could not
    sit under it, and the forecast measures backward by the allocator's running peak."""
    from lms_swap import device_memory, swapper

    def no_build(*a, **k):
        raise AssertionError("the net was built under the LMS allocator")
    monkeypatch.setattr(swapper, "load_guard", no_build)
    meter = _Meter()
    sw = m.ActivationSwapper(device_type="cuda", policy="auto")
    device_memory.use_peak_meter(meter)
    try:
        assert sw._guard() is None
        assert sw._meter() is meter
        assert sw._forecast._meter() is meter
    finally:
        device_memory.use_peak_meter(None)


def test_the_swapper_tells_the_forecast_which_forwards_were_dropped(m):
    from torch import nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(64, 256)
    sw = cpu_swapper(m)
    seen = []
    begin = sw._forecast.begin_forward

    def record(st, abandoned=False):
        seen.append(abandoned)
        begin(st, abandoned)
    sw._forecast.begin_forward = record
    with sw:
        loss = net(x).sum()
    loss.backward()
    with sw:
        net(x).sum()             # evaluation with autograd on: the graph is dropped
    with sw:
        loss = net(x).sum()
    loss.backward()
    # (the first forward has no device state to tell yet): the second follows a
    # backward, the third a forward dropped without one
    assert seen == [False, True], seen


def test_the_plan_comes_first_then_pressure(m):
    from lms_swap.forecast import StepForecast
    config = m.SwapConfig(device_type="cpu", policy="auto", device_limit=100 * MiB,
                          margin=10 * MiB, query_every=1)
    level = {"now": 0}
    forecast = StepForecast(config, guard=lambda: None, allocated_of=lambda st: level["now"])
    st = m.DevState(None)
    st.largest, st.plan = MiB, 2 * MiB
    assert forecast.decide(st, MiB, 0) == ("plan", False)
    st.planned = 2 * MiB                    # the plan is swapped
    assert forecast.decide(st, MiB, 0) == (None, False)
    level["now"] = 95 * MiB                 # over the trigger (90 MiB) and the limit
    assert forecast.decide(st, MiB, 0) == ("pressure", True)


class _Owner:
    """Stands in for the swapper a handle returns its host memory to."""

    def release_handle(self, h):
        pass


def _swapped(m, owner, value, order):
    """A handle whose bytes are in host memory, last in the swap order ``order``."""
    from lms_swap.copies import copy_into_pieces, flat_bytes
    from lms_swap.state import Swapped
    t = torch.full((MiB // 4,), float(value))
    piece = torch.empty(MiB, dtype=torch.uint8)
    copy_into_pieces([piece], flat_bytes(t), non_blocking=False)
    h = Swapped.of(owner, t, MiB, host=[piece])
    h.index = len(order)
    order.append(weakref.ref(h))
    return h


@pytest.fixture
def prefetcher_and_state(m):
    from lms_swap.prefetch import Prefetcher
    config = types.SimpleNamespace(prefetch_depth=8, policy="auto", prefetch_past_peak=False)
    room = {"limit": 100 * MiB, "reserve": 10 * MiB, "now": 86 * MiB}
    forecast = types.SimpleNamespace(limit=lambda st: room["limit"],
                                     prefetch_reserve=lambda st: room["reserve"],
                                     reserve_factor=lambda st: 1.5)
    prefetcher = Prefetcher(config, forecast, lambda st: room["now"], lambda: 1)
    return prefetcher, m.DevState(None), room


def test_prefetching_stops_at_the_reserve_and_fetches_newest_first(m, prefetcher_and_state):
    prefetcher, st, room = prefetcher_and_state
    owner = _Owner()
    handles = [_swapped(m, owner, i, st.order) for i in range(6)]
    prefetcher.begin_backward(st)
    assert st.cursor == 6 and st.order_max == [MiB] * 6
    prefetcher.prefetch(st, st.cursor, torch.device("cpu"))  # room: 100 - 10 - 86 = 4 MiB
    assert [h.gpu is not None for h in handles] == [False, False, True, True, True, True]
    assert all(torch.equal(h.gpu, torch.full((MiB // 4,), float(i)))
               for i, h in enumerate(handles) if h.gpu is not None)
    c = prefetcher.counts
    assert (c["prefetched"], c["prefetch_deferred"], c["in_count"]) == (4, 1, 4)
    assert c["in_bytes"] == 4 * MiB and c["prefetched_by_lesson"] == 0


def test_prefetching_leaves_what_this_pass_used_and_what_is_back(m, prefetcher_and_state):
    prefetcher, st, room = prefetcher_and_state
    owner = _Owner()
    handles = [_swapped(m, owner, i, st.order) for i in range(4)]
    handles[3].pass_id = 1                  # unpacked in this backward already
    handles[2].gpu = torch.zeros(1)         # fetched already
    room["now"] = 0
    prefetcher.prefetch(st, 4, torch.device("cpu"))
    assert prefetcher.counts["prefetched"] == 2
    assert handles[0].ahead and handles[1].ahead and not handles[3].ahead


def test_the_swapper_reports_the_counts_of_what_it_owns(m):
    sw = cpu_swapper(m)
    sw._forecast.counts["margin_updates"] += 2
    sw._prefetcher.counts["prefetched"] += 5
    s = sw.stats()
    assert s["swap.margin_updates"] == 2 and s["swap.prefetched"] == 5
    assert s["swap.in_count"] == 0 and s["swap.guard_forward_bytes"] == 0
    sw.reset_stats()
    s = sw.stats()
    assert "swap.margin_updates" not in s and s["swap.prefetched"] == 0
