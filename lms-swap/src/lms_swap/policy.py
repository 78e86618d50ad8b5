"""The tunables, and the policy's arithmetic: when to swap, and what a step teaches the
next (pure functions, tested on their own)."""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Any, Dict, List, Optional

import torch

from .environment import GiB, MiB, check_environment, threshold_from_env

__all__ = ["SwapConfig", "check_settings", "damped", "dense_span", "growth_to_end", "in_tail",
           "inflight_room", "learn_margin", "next_margin_factor", "next_plan", "next_reserve_factor",
           "next_slack", "predict_forward_end", "releases_persist", "settled_plan", "should_swap",
           "storage_bytes", "swap_trigger"]


class SwapConfig:
    """Tunables of :class:`ActivationSwapper` (see the module docstring)."""

    _fields = {
        "policy": "auto",
        "size_threshold": 1 * MiB,
        "device_limit": None,
        "device_limit_fraction": None,
        "margin": None,
        "margin_factor": 5.0,
        "adaptive_margin": True,
        "min_margin": 512 * MiB,
        "min_margin_factor": None,
        "first_margin_fraction": None,
        "prefetch_reserve_factor": 1.5,
        "prefetch_depth": 48,
        "prefetch_past_peak": True,
        "max_inflight_bytes": 1 * GiB,
        "query_every": 8,
        "plan": True,
        "host_limit": None,
        "host_min_available": None,
        "dedupe": True,
        "min_storage_fraction": 0.5,
        "trace": False,
        "guard": True,
        "device_type": "cuda",
        "chunked_loss": "auto",
        "settle_when_releases_persist": False,
    }

    def __init__(self, **kw: Any) -> None:
        for k, v in self._fields.items():
            setattr(self, k, v)
        env_thr = threshold_from_env()
        if env_thr is not None:
            self.size_threshold = env_thr
        self.update(**kw)

    def update(self, **kw: Any) -> "SwapConfig":
        """Applies ``kw`` once every value (and the environment's settings) is checked; a
        refused value changes nothing."""
        for k in kw:
            if k not in self._fields:
                raise TypeError(
                    f"unknown LMS swap option {k!r}; known: {', '.join(sorted(self._fields))}"
                )
        values = self.as_dict()
        values.update(kw)
        check_settings(values)
        for k, v in kw.items():
            setattr(self, k, v)
        return self

    def validate(self) -> None:
        """Checks every tunable and the environment's settings (ValueError naming the
        setting, its value and what is accepted)."""
        check_settings(self.as_dict())

    def as_dict(self) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in self._fields}


_BOOL = "True or False"


def _bad(key: str, value: Any, accepted: str) -> ValueError:
    return ValueError(f"LMS swap option {key}={value!r} is not accepted; accepted: {accepted}")


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or (type(v) is int and v in (0, 1))


def _is_number(v: Any) -> bool:
    return (isinstance(v, numbers.Real) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


# key: (test, what is accepted); None passes where the default is None
_RULES = {
    "policy": (lambda v: v in ("auto", "always", "never"), "'auto', 'always' or 'never'"),
    "size_threshold": (lambda v: _is_number(v) and v >= 0, "a finite number of bytes >= 0"),
    "device_limit": (lambda v: _is_number(v) and v > 0, "None or a finite number of bytes > 0"),
    "device_limit_fraction": (lambda v: _is_number(v) and 0 < v <= 1, "None or a number in (0, 1]"),
    "margin": (lambda v: _is_number(v) and v >= 0, "None or a finite number of bytes >= 0"),
    "margin_factor": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    "adaptive_margin": (_is_bool, _BOOL),
    "min_margin": (lambda v: _is_number(v) and v >= 0, "a finite number of bytes >= 0"),
    "min_margin_factor": (lambda v: _is_number(v) and v >= 0, "None or a finite number >= 0"),
    "first_margin_fraction": (lambda v: _is_number(v) and 0 <= v < 1, "None or a number in [0, 1)"),
    "prefetch_reserve_factor": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    "prefetch_depth": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "prefetch_past_peak": (_is_bool, _BOOL),
    "max_inflight_bytes": (lambda v: _is_number(v) and v > 0, "a finite number of bytes > 0"),
    "query_every": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "plan": (_is_bool, _BOOL),
    "host_limit": (lambda v: _is_number(v) and v >= 0,
                   "None (env PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB, else 80% of host memory "
                   "shared by the node's processes) or a finite number of bytes >= 0"),
    "host_min_available": (lambda v: _is_number(v) and v >= 0,
                           "None or a finite number of bytes >= 0"),
    "dedupe": (_is_bool, _BOOL),
    "min_storage_fraction": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "trace": (_is_bool, _BOOL),
    "guard": (_is_bool, _BOOL),
    "device_type": (lambda v: v in ("cuda", "cpu"), "'cuda' (or 'cpu' for tests)"),
    "chunked_loss": (lambda v: v == "auto" or _is_bool(v), "'auto', True or False"),
    "settle_when_releases_persist": (_is_bool, _BOOL),
}


def check_settings(values: Dict[str, Any]) -> None:
    """Checks tunables (``values``: name -> value) and the environment's settings; raises
    ValueError naming the first bad one, its value and what is accepted."""
    for key, value in values.items():
        if value is None and SwapConfig._fields.get(key, 0) is None:
            continue
        test, accepted = _RULES[key]
        try:
            ok = bool(test(value))
        except Exception:  # a value that cannot even be compared
            ok = False
        if not ok:
            raise _bad(key, value, accepted)
    check_environment()


def dense_span(t: torch.Tensor) -> bool:
    """True when t's elements fill [storage_offset, storage_offset + numel) exactly
    once (contiguous in some order of dimensions: contiguous, channels_last,
    transposes, permutes); False for gaps (slices with steps) or overlap (expand)."""
    if t.is_contiguous():
        return True
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.size()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the storage under ``t``, as the elements of the tensor that owns it
    (``t`` itself, or the base of a view).  Not ``t.untyped_storage().nbytes()``: on
    torch 2.11 the Python storage object that call makes stays attached to the storage
    as a second owner for as long as the storage lives, and the eviction net moves only
    tensors whose storage has no other owner (measured on the H100: every kept tensor
    was skipped)."""
    root = t._base if t._base is not None else t
    return root.numel() * root.element_size()


def swap_trigger(device_limit: int, margin: int) -> int:
    """Device bytes allocated above which forward swaps what it saves: the limit less
    the room backward needs on top of what forward leaves (``margin``).  Tensors that
    wait for their copy to the host are bounded separately (the swapper's
    ``CopyPacer.bound``: forward waits for the oldest copies beyond the limit)."""
    return int(device_limit) - int(margin)


def should_swap(nbytes: int, allocated: int, device_limit: int, margin: int) -> bool:
    """The pressure rule: swap a saved tensor of ``nbytes`` when the device allocation
    (which already holds it) plus as much again (the next layer's output is usually of
    that size) is above :func:`swap_trigger`.  (Measured on the H100: without the second
    ``nbytes`` forward ran ~4 GiB further and ResNet-50 at 1.5x ran out of memory.)"""
    return allocated + nbytes > swap_trigger(device_limit, margin)


def inflight_room(device_limit: int, largest: int, allocated: int, nbytes: int) -> int:
    """Device bytes that tensors waiting for their copy out may hold, by the in-flight
    bound: the limit less room for the next allocation (``largest``, the largest saved
    tensor) less the allocation.  ``nbytes`` is the tensor being swapped right now, which
    the allocation and the copies both count.  Forward waits for its oldest copies while
    more than this waits (negative: for all of them but the current one)."""
    return int(device_limit) - int(largest) - (int(allocated) - int(nbytes))


def in_tail(saved_before: int, nbytes: int, prev_saved: Optional[int], largest: int) -> bool:
    """Whether a tensor is one of the last that forward saves, by the previous step:
    less than ``largest`` bytes were saved after its position (``saved_before`` bytes
    saved before it in this forward, ``prev_saved`` in the whole previous forward; None
    while no forward has ended).  Backward needs these tensors first, so swapping them
    under pressure frees their device memory only from the end of forward until
    backward fetches them again at once, and cannot lower backward's peak.  (GPT-2 on
    the H100 at stock's largest batch: one 3.5 GB loss chunk went out at the end of
    every forward and came back on demand at the start of backward, and the step ran at
    70-76% of stock.)"""
    if prev_saved is None:
        return False
    return int(prev_saved) - (int(saved_before) + int(nbytes)) < int(largest)


def growth_to_end(offsets: List[int], unswapped: List[int], forward_end: int,
                  swapped: int) -> List[int]:
    """What a step taught about the rest of its forward: for each point where the
    allocation was read (``offsets[i]`` bytes saved so far, ``unswapped[i]`` = device
    allocation plus the bytes swapped so far), how much more the allocation would grow
    until forward's end without further swapping (``forward_end`` + ``swapped`` at the
    end, less ``unswapped[i]``; negative where transients end: a language model's loss
    frees its logits)."""
    end = int(forward_end) + int(swapped)
    return [end - int(u) for u in unswapped]


def predict_forward_end(allocated: int, offset: int, prev_offsets: List[int],
                        prev_growth: List[int], prev_saved: Optional[int]) -> Optional[int]:
    """The device allocation at forward's end if nothing more were swapped, by the
    previous step (:func:`growth_to_end`) at the last point it read at or before
    ``offset`` bytes saved; None when it has no such point or this forward has saved
    more than the previous one did (``prev_saved``)."""
    if prev_saved is None or offset > prev_saved or not prev_offsets:
        return None
    i = bisect.bisect_right(prev_offsets, offset) - 1
    if i < 0:
        return None
    return int(allocated) + int(prev_growth[i])


def next_plan(swapped: int, forward_end: int, trigger: int, slack: int,
              peak_over: Optional[int] = None, rescued: bool = False) -> int:
    """Bytes to swap from the *start* of the next forward.

    Swapping the first tensors of forward is best: their copy out overlaps the rest of
    forward and backward needs them last, so their copy in overlaps backward.  This step
    swapped ``swapped`` bytes and ended forward with ``forward_end`` bytes allocated
    (the caching allocator stops counting a swapped tensor when forward drops it, even
    while its copy to the host still runs): keeping the end of forward ``slack`` under
    the trigger needs ``swapped + end - trigger + slack`` bytes swapped (too much
    swapping shows as an end below the trigger and lowers the plan).  (An earlier
    version also subtracted the bytes still in flight; that counted them twice, and on
    the H100 the plan fell to 0 at 1.25x and the next step ran out of memory.)

    ``peak_over`` is how far forward's own peak went over (negative: stayed under) what
    the caching allocator can have, after this step's swapping and the eviction net's
    moves (both in ``swapped``).  Where a transient near forward's end (a language
    model's logits and loss) is forward's highest point, an end under the trigger says
    nothing about it: the plan follows whichever of the two is nearer its bound, so a
    step the net had to rescue in forward swaps what the net moved from the start of
    the next (None: no peak measured, the end alone decides).

    ``rescued``: the net caught an out-of-memory error in this forward.  Its peak then
    reached the capacity, whatever the running peak shows (the request that failed was
    never allocated, and what the net moved counts in neither reading), so the need is
    at least nothing: the next forward swaps at least what this one and the net moved.
    (On the H100 a decoder at 1.5x whose length cycles: the running peak read 1.9 GB
    under the capacity after the net had moved 1.3 GB for the fp32 logits, the plan
    stayed where it was, and the next step of that length needed the net again.)"""
    need = int(forward_end) - int(trigger)
    if peak_over is not None:
        need = max(need, int(peak_over))
    if rescued:
        need = max(need, 0)
    return max(0, int(swapped) + need + int(slack))


def settled_plan(plan: int, plan_before: int, swapped: int, harmless: bool) -> int:
    """The plan for the next step of a shape, once the step that raised it has run.

    :func:`next_plan` runs at forward's end and raises the plan when forward ended over
    the trigger, which is a forecast of backward's need (the margin).  A step that then
    ran its backward without the eviction net moving anything and without the caching
    allocator releasing its cache (``harmless``) showed that what it swapped was enough:
    the raise is taken back to what that step started with (or swapped, where that was
    more).  Without this, margin and plan fed each other: on the H100 a checkpointed
    Llama at 1.5x swapped 54.7 and 26.4 GB in turns, each 26.4 GB step harmless at
    stock's speed and each 54.7 GB step 1.3 s slower.  A step that needed the net keeps
    the raise."""
    if not harmless or plan <= plan_before:
        return int(plan)
    return int(max(plan_before, swapped))


def releases_persist(swapped: int, releases: int, before: Optional[tuple]) -> bool:
    """Whether the caching allocator's releases in a step that swapped ``swapped`` bytes
    (``releases`` of them) also came in the step before it, of the same shape, which swapped
    more and did not need the eviction net either: ``before`` is that step's (bytes
    swapped, releases), or None where it was of another shape or needed the net.  Swapping
    more did not spare the releases then, so they are not the harm of swapping less, and
    :func:`settled_plan` may take back a raise that only repeats the larger swap.  (On an
    H200 held to an H100's size, a Llama checkpointed on every other layer at twice stock's
    batch released its cache once in every step, whether it swapped 90.3 or 72.0 GB; the
    plan was never taken back, and the two kinds of step alternated for good.)"""
    if before is None or releases <= 0:
        return False
    more, had = before
    return int(more) > int(swapped) and int(had) >= int(releases)


def learn_margin(
    forward_end: int,
    peak_before: int,
    peak_after: int,
    min_margin: int,
) -> int:
    """Backward's own memory need, learned after a step.

    ``forward_end`` is the device allocation at the end of forward.  Backward's peak less
    that is what backward needed on top of it (its gradients and workspaces, and what
    prefetching brought back early): exact when the step's backward set a new peak
    (``peak_after > peak_before``), an upper bound otherwise.  With 5% added, never
    below ``min_margin``.  (The level prefetching filled memory to is not a better
    base: backward's peak comes at another moment, and on the H100 a margin learned
    from it fell to a third of the largest tensor, then the next step ran out of
    memory.)"""
    extra = max(0, int(peak_after) - int(forward_end))
    return max(int(min_margin), int(extra * 1.05))


def damped(learned: float, previous: Optional[float], keep: float = 0.5) -> float:
    """What a step's lesson may lower a learned quantity to: not below ``keep`` times
    its previous value (None: nothing learned yet).  Raising is never damped.  One odd
    step (a short last batch, an eval pass, a step after the eviction net moved
    memory) then cannot undo what the steps before it learned: on an H100 a Llama-style
    decoder's plan fell from 24.4 to 8.8 GiB and its margin from 27 to 4.4 GiB after
    one step, and the next step ran out of memory."""
    if previous is None:
        return learned
    return max(learned, keep * previous)


def next_reserve_factor(current: float, peak: int, limit: int) -> float:
    """The prefetch headroom, as a multiple of the largest saved tensor, after a step
    whose backward set a new ``peak``: a quarter more when that peak went over
    ``limit``, else unchanged.  Never lowered, capped at 8."""
    k = float(current)
    if peak > limit:
        k *= 1.25
    return min(8.0, k)


def next_slack(current: int, released: bool, swapped: int, limit: int) -> int:
    """Device bytes kept free on top of the learned margin, after a step.

    A step that moved memory (swapped, or the net evicted) and in which the caching
    allocator still had to release cached segments to serve a request ran the
    allocator to its edge: each such retry synchronises the device and remaps what it
    gave back (0.1 s each for a UNet at 1.5x on the H100, 5 of them a step with the
    exact margin), while a GiB more swapped costs some 40 ms of copies that overlap
    compute.  Raise by a 64th of the limit (at least 256 MiB), up to a 16th; never
    lowered.  A step that moved less than a 16th of the limit (``swapped`` bytes) is
    left alone: at a batch stock PyTorch trains, the retries are stock's own (ViT-L
    there retries once a step, stock as well), and a slack learned from them doubled
    what it swapped and pinned (4 GiB a step, host RSS 4.2 GiB over stock's)."""
    cur = max(0, int(current))
    if released and swapped >= int(limit) // 16:
        cur = min(int(limit) // 16, cur + max(256 * MiB, int(limit) // 64))
    return cur


def next_margin_factor(
    current: Optional[float],
    largest: int,
    forward_end: int,
    peak_before: int,
    peak_after: int,
    min_margin: int,
    min_factor: float = 0.0,
) -> float:
    """The margin, as a multiple of the largest saved tensor, for the next step.

    A step whose backward set a new peak measured backward's need exactly: take it, up
    or down.  Otherwise the peak is older and only bounds this step's need from above:
    lower the factor to it, never raise it (``current`` None: nothing learned yet).
    Never below ``min_factor``."""
    need = learn_margin(forward_end, peak_before, peak_after, min_margin)
    k = need / max(1, int(largest))
    if current is not None and peak_after <= peak_before:
        k = min(float(current), k)
    return max(float(min_factor), k)
