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

    def _release(self, h):
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
