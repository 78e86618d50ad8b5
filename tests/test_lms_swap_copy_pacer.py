"""How far forward's copies out may run behind it (lms_swap.copies.CopyPacer), on its own: events
that say when a copy has run stand in for CUDA events, so the waits can be counted on CPU."""
from __future__ import annotations

import collections
import types

import pytest

GiB = 1 << 30


class Copy:
    """A copy out that has run (``done``) or runs once someone waits for it."""

    def __init__(self, done=False):
        self.done = done
        self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True


@pytest.fixture
def pacer_and_state(m):
    from lms_swap.copies import CopyPacer
    from lms_swap.state import DevState

    st = DevState(0)
    st.largest = 2 * GiB
    allocated = {"now": 60 * GiB}
    config = types.SimpleNamespace(max_inflight_bytes=1 * GiB)
    pacer = CopyPacer(config, lambda s: 78 * GiB, lambda s: allocated["now"], lambda: 0)
    return pacer, st, allocated


def _queue(st, copies):
    st.inflight = collections.deque((c, n) for c, n in copies)
    st.inflight_bytes = sum(n for _, n in copies)


def test_finished_copies_are_forgotten_without_waiting(pacer_and_state):
    pacer, st, _ = pacer_and_state
    a, b, c = Copy(True), Copy(True), Copy(False)
    _queue(st, [(a, GiB), (b, GiB), (c, GiB)])
    pacer.drain(st, wait=False)
    assert [x for x, _ in st.inflight] == [c] and st.inflight_bytes == GiB
    assert not c.waited and pacer.counts["throttle_waits"] == 0


def test_waiting_stops_at_the_allowance_oldest_first(pacer_and_state):
    pacer, st, _ = pacer_and_state
    copies = [Copy() for _ in range(4)]
    _queue(st, [(c, GiB) for c in copies])
    pacer.drain(st, wait=True)  # allowance: the largest saved tensor, 2 GiB
    assert [c.waited for c in copies] == [True, True, False, False]
    assert st.inflight_bytes == 2 * GiB
    assert pacer.counts["throttle_waits"] == 2 and pacer.throttle_s >= 0


def test_bound_waits_only_where_the_copies_crowd_the_limit(pacer_and_state):
    pacer, st, allocated = pacer_and_state
    copies = [Copy() for _ in range(6)]
    _queue(st, [(c, 3 * GiB) for c in copies])
    pacer.bound(st, 0)  # room: 78 - 2 - 60 = 16 GiB, 18 waiting
    assert pacer.counts["inflight_bounded"] == 1
    assert st.inflight_bytes <= 16 * GiB and copies[0].waited and not copies[-1].waited
    allocated["now"] = 40 * GiB  # room 36 GiB: nothing to wait for
    waited = sum(c.waited for c in copies)
    pacer.bound(st, 0)
    assert sum(c.waited for c in copies) == waited and pacer.counts["inflight_bounded"] == 1


def test_reset_clears_the_counts(pacer_and_state):
    pacer, st, _ = pacer_and_state
    _queue(st, [(Copy(), 3 * GiB)])
    pacer.drain(st, wait=True, allowance=0)
    assert pacer.counts["throttle_waits"] == 1
    pacer.reset()
    assert not pacer.counts and pacer.throttle_s == 0.0


def test_the_swapper_reports_the_pacers_counts(m):
    sw = m.ActivationSwapper(device_type="cpu")
    sw._pacer.counts["throttle_waits"] += 3
    sw._pacer.throttle_s = 0.25
    s = sw.stats()
    assert s["swap.throttle_waits"] == 3 and s["swap.throttle_wait_ms"] == 250
    sw.reset_stats()
    assert sw.stats()["swap.throttle_waits"] == 0
