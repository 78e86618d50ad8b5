"""Backward's own memory by position (lms_swap.backward_profile): what one backward teaches the
next about how far prefetching may fill the device.  The numbers follow a checkpointed decoder:
the loss's gradient is backward's peak and comes first, the layers after it need little."""
from __future__ import annotations

import pytest

GiB = 1 << 30
LIMIT = 78 * GiB


@pytest.fixture
def bp(m):
    import lms_swap.backward_profile as bp
    return bp


def _loss_first_backward(prof, evicted=0, ahead_at=None, used=False, forward_evicted=0):
    """Backward from 9 GiB: the loss's interval peaks at 73 GiB, then three layers (swapped
    tensors saved at offsets 30, 20 and 10 GiB) each grow 2 GiB over 12 GiB."""
    prof.begin(9 * GiB)
    prof.used = used  # (prefetching set it where it went past the old rule)
    prof.boundary(40 * GiB, 0, 9 * GiB)              # the logits come back: loss starts
    prof.boundary(30 * GiB, 64 * GiB, 12 * GiB)      # its gradient peaked at 73 GiB
    if ahead_at is not None:
        prof.prefetched(ahead_at)
        prof.settle()
    prof.boundary(20 * GiB, 2 * GiB, 12 * GiB + (ahead_at or 0))
    prof.boundary(10 * GiB, 2 * GiB, 12 * GiB + (ahead_at or 0))
    return prof.end(2 * GiB, evicted, LIMIT, forward_evicted)


def test_the_room_opens_once_backwards_peak_has_passed(bp):
    prof = bp.BackwardProfile()
    peak, lesson = _loss_first_backward(prof)
    assert peak == 73 * GiB and lesson.top == 73 * GiB
    prof.begin(9 * GiB)
    # before and during the loss: the whole peak is still ahead, no room beyond forward's end
    assert prof.room(lesson, LIMIT, 9 * GiB) <= 0
    prof.boundary(40 * GiB, 0, 9 * GiB)
    assert prof.room(lesson, LIMIT, 9 * GiB) <= 0
    # past the loss: the device may fill up to the last peak less the 2 GiB the rest needs
    prof.boundary(30 * GiB, 64 * GiB, 12 * GiB)
    assert prof.room(lesson, LIMIT, 12 * GiB) == 73 * GiB - 14 * GiB
    # a layer later, with 20 GiB prefetched and unused: they count against the room
    prof.prefetched(20 * GiB)
    prof.settle()
    prof.boundary(20 * GiB, 2 * GiB, 32 * GiB)
    assert prof.room(lesson, LIMIT, 32 * GiB) == 73 * GiB - 14 * GiB - 20 * GiB


def test_prefetched_bytes_are_not_backwards_own_need(bp):
    """A backward that prefetched 30 GiB past its peak teaches the same as one that did not."""
    _, plain = _loss_first_backward(bp.BackwardProfile())
    _, filled = _loss_first_backward(bp.BackwardProfile(), ahead_at=30 * GiB)
    assert filled.keys == plain.keys
    assert filled.growth == plain.growth and filled.rest_peak == plain.rest_peak


def test_the_room_never_passes_the_limit_less_the_pad(bp):
    prof = bp.BackwardProfile()
    _, lesson = _loss_first_backward(prof)
    high = lesson._replace(top=LIMIT)
    prof.begin(9 * GiB)
    prof.boundary(20 * GiB, 0, 12 * GiB)
    pad = max(256 << 20, LIMIT // 64)
    assert prof.room(high, LIMIT, 12 * GiB) == LIMIT - pad - 14 * GiB


def test_an_unknown_offset_takes_the_interval_under_way(bp):
    """A tensor swapped now but kept in the step that taught: the interval that began at the
    next offset above it (earlier in backward) gives the forecast."""
    _, lesson = _loss_first_backward(bp.BackwardProfile())
    assert lesson.at(25 * GiB) == lesson.at(30 * GiB)
    assert lesson.at(5 * GiB) == lesson.at(10 * GiB)
    assert lesson.at(bp.START)[0] == 64 * GiB  # from forward's end: the loss's peak ahead


def test_no_lesson_means_no_room_and_a_net_intervention_teaches_nothing(bp):
    prof = bp.BackwardProfile()
    assert prof.room(None, LIMIT, 0) is None
    _, lesson = _loss_first_backward(prof, evicted=1 << 20)
    assert lesson is None and prof.pad is None  # the old rule was in use: pad unchanged
    _loss_first_backward(prof, evicted=1 << 20, used=True)
    _loss_first_backward(prof, evicted=1 << 20, used=True)
    floor = max(256 << 20, LIMIT // 64)
    assert prof.pad == 4 * floor
    for _ in range(10):
        _loss_first_backward(prof, evicted=1 << 20, used=True)
    assert prof.pad == LIMIT // 8


def test_a_step_whose_forward_needed_the_net_teaches_nothing(bp):
    """Its backward fetched on demand what the net moved, and the next step of its shape
    swaps more by plan: no lesson, and the pad stays (the lesson was not wrong)."""
    prof = bp.BackwardProfile()
    peak, lesson = _loss_first_backward(prof, forward_evicted=1 << 30, used=True)
    assert peak == 73 * GiB and lesson is None and prof.pad is None
    assert _loss_first_backward(prof)[1] is not None


def test_a_lesson_is_kept_for_its_exact_shape_only(m):
    from lms_swap.profiles import ShapeProfiles
    from lms_swap.state import DevState
    st = DevState(None)
    profiles = ShapeProfiles()
    profiles.enter(st, ((4, 128), "torch.int64"))
    st.plan, st.prev_saved, st.largest, st.bwd_lesson = 1, 2, 3, "lesson of 4x128"
    assert profiles.enter(st, ((4, 256), "torch.int64")) == "scaled"
    assert st.bwd_lesson is None
    assert profiles.enter(st, ((4, 128), "torch.int64")) == "exact"
    assert st.bwd_lesson == "lesson of 4x128"


def test_the_callers_reserve_widens_the_pad(bp):
    """The swapper asks for 1.5x the largest swapped tensor still to come back: where that
    is more than the pad, the room shrinks by the difference."""
    prof = bp.BackwardProfile()
    _, lesson = _loss_first_backward(prof)
    high = lesson._replace(top=LIMIT)
    prof.begin(9 * GiB)
    prof.boundary(20 * GiB, 0, 12 * GiB)
    assert prof.room(high, LIMIT, 12 * GiB, reserve=6 * GiB) == LIMIT - 6 * GiB - 14 * GiB
    small = prof.room(high, LIMIT, 12 * GiB, reserve=1)
    assert small == prof.room(high, LIMIT, 12 * GiB)


def test_an_observer_is_told_each_backward_and_interval_as_it_closes(bp):
    """observe(): the start, each interval (its offset, None before the first unpack; the
    level it began at; its peak; bytes ahead) and the end, in order; nothing once unset."""
    events = []
    bp.observe(lambda kind, f: events.append((kind, f)))
    try:
        _loss_first_backward(bp.BackwardProfile(), ahead_at=3 * GiB)
    finally:
        bp.observe(None)
    assert [k for k, _ in events] == ["begin"] + ["interval"] * 5 + ["end"]
    assert events[0][1] == {"level": 9 * GiB}
    iv = [f for k, f in events if k == "interval"]
    assert [f["key"] for f in iv] == [None, 40 * GiB, 30 * GiB, 20 * GiB, 10 * GiB]
    assert iv[1] == {"key": 40 * GiB, "level": 9 * GiB, "peak": 73 * GiB, "ahead": 0}
    assert iv[2] == {"key": 30 * GiB, "level": 12 * GiB, "peak": 14 * GiB, "ahead": 3 * GiB}
    assert events[-1][1] == {"peak": 73 * GiB}
    _loss_first_backward(bp.BackwardProfile())
    assert len(events) == 7
