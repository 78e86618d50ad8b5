"""Where forward waits for all its copies out (lms_swap.retry_points with the CopyPacer that asks
it): a retry of the caching allocator that came while copies ran teaches the reading before it,
the next forward of that shape waits there, and a point where waiting did not spare the retry is
dropped for good.  Events that say when a copy has run stand in for CUDA events, and a counter for
the allocator's retries, so the waits can be counted on CPU."""
from __future__ import annotations

import collections
import types

import pytest

GiB = 1 << 30


class Copy:
    """A copy out that runs once someone waits for it."""

    def __init__(self):
        self.done = self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = self.done = True


class Forward:
    """One device's forward as the swapper drives the pacer: every saved tensor of ``nbytes``
    is counted in ``st.saved``, its copy out queued, the pacer's bound asked, and the allocation
    read (each reading also reads the allocator's retry count, as device_memory does)."""

    def __init__(self, wait=True):
        from lms_swap.copies import CopyPacer
        from lms_swap.retry_points import RetryPoints
        from lms_swap.state import DevState

        self.st = DevState(0)
        self.st.largest = 1 * GiB
        self.retries = 0
        self.points = RetryPoints(lambda index: self.retries)
        config = types.SimpleNamespace(max_inflight_bytes=64 * GiB, wait_at_retry_points=wait)
        # a limit far away: only the retry points make the pacer wait here
        self.pacer = CopyPacer(config, lambda s: 1000 * GiB, self.read, lambda: 0, self.points)
        self.copies = []

    def read(self, st=None):
        self.points.reading(self.st, in_forward=True)
        return 10 * GiB

    def begin(self):
        self.points.begin_forward(self.st)
        self.st.saved = 0
        self.st.swapped_in_fwd = 0
        self.st.inflight, self.st.inflight_bytes = collections.deque(), 0
        self.copies = []
        self.read()  # the first save's reading (the profile's base)

    def save(self, nbytes, retry_before=False):
        """A tensor is saved and swapped; ``retry_before``: the allocator released its cache
        while serving the op that made it."""
        if retry_before:
            self.retries += 1
        self.st.saved += nbytes
        c = Copy()
        self.copies.append(c)
        self.st.inflight.append((c, nbytes))
        self.st.inflight_bytes += nbytes
        self.st.swapped_in_fwd += 1
        self.pacer.bound(self.st, nbytes)
        self.read()


def _forward(f, retry_at=None):
    f.begin()
    for i in range(6):
        f.save(2 * GiB, retry_before=(i == retry_at))


def test_a_retry_while_copies_run_teaches_the_reading_before_it():
    f = Forward()
    _forward(f, retry_at=4)          # the retry came between the readings at 8 and 10 GiB
    assert not any(c.waited for c in f.copies)  # (nothing learned yet: no wait)
    assert f.points.counts["retry_points_learned"] == 1
    assert f.points.counts["retries_under_copies"] == 1
    f.begin()
    assert f.st.drain_at == [8 * GiB]


def test_the_next_forward_waits_for_every_copy_at_the_point():
    f = Forward()
    _forward(f, retry_at=4)
    _forward(f)                      # this one's allocator served it from the cache
    # at 8 GiB (the fourth tensor) every copy queued so far was waited for, none after it
    assert [c.waited for c in f.copies] == [True] * 4 + [False] * 2
    assert f.points.counts["retry_point_waits"] == 1
    f.begin()
    assert f.st.drain_at == [8 * GiB]  # it spared the retry: kept
    assert f.points.counts["retries_under_copies"] == 1  # (the first forward's only)


def test_a_point_whose_wait_did_not_spare_the_retry_is_dropped_for_good():
    f = Forward()
    _forward(f, retry_at=4)
    _forward(f, retry_at=4)          # every copy had run, and the allocator released anyway
    assert f.points.counts["retry_points_dropped"] == 1
    f.begin()
    assert f.st.drain_at == [] and f.st.drain_dropped == [8 * GiB]
    _forward(f, retry_at=4)          # the same retry with copies in flight: not learned again
    assert f.points.counts["retry_points_learned"] == 1
    assert f.points.counts["retries_under_copies"] == 2  # (the first and the last forward)
    assert not any(c.waited for c in f.copies)


def test_waiting_off_learns_but_never_waits():
    f = Forward(wait=False)
    _forward(f, retry_at=4)
    _forward(f, retry_at=4)
    assert not any(c.waited for c in f.copies)
    assert f.points.counts["retry_point_waits"] == 0


def test_a_retry_with_no_copy_in_flight_teaches_nothing():
    f = Forward()
    f.begin()
    f.retries += 1                   # (a retry before any copy was queued)
    f.read()
    f.begin()
    assert not f.st.drain_at and f.points.counts["retry_points_learned"] == 0


def test_points_belong_to_their_exact_shape():
    from lms_swap.profiles import ShapeProfiles

    f = Forward()
    f.st.profiles = ShapeProfiles()
    f.st.sig = ((8, 2048), "torch.int64")
    _forward(f, retry_at=4)
    f.begin()
    f.st.profiles.enter(f.st, ((8, 1024), "torch.int64"))  # another length
    assert f.st.drain_at is None
    f.st.profiles.enter(f.st, ((8, 2048), "torch.int64"))  # back to the one that taught it
    assert f.st.drain_at == [8 * GiB]


def test_the_option_is_checked_and_reported():
    from lms_swap.policy import SwapConfig
    from lms_swap.report import SWAP_KEYS

    assert SwapConfig().wait_at_retry_points is False  # (until a GPU run has measured it)
    with pytest.raises(ValueError, match="wait_at_retry_points"):
        SwapConfig(wait_at_retry_points="yes")
    assert {"retries_under_copies", "retry_points_learned", "retry_point_waits",
            "retry_points_dropped"} <= set(SWAP_KEYS)


def test_copies_that_have_run_are_not_in_flight():
    """A retry after a reading whose queued copies had all run (the pacer had not yet looked)
    teaches nothing."""
    f = Forward()
    f.begin()
    for i in range(3):
        f.save(2 * GiB)
    for c in f.copies:
        c.done = True                # they ran; st.inflight still lists them
    f.read()
    f.retries += 1
    f.read()
    f.begin()
    assert not f.st.drain_at and f.points.counts["retries_under_copies"] == 0
