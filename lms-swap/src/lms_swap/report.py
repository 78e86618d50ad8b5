"""What the swapper reports in :meth:`~.swapper.ActivationSwapper.stats`: its counters and
those of the objects it owns as ``swap.*``, what the forecast holds for each device as
``policy.<dev>.*``, the host pool's ``host.*`` and the eviction net's ``guard.*``.

It keeps one invariant: the keys a reader looks for do not depend on what happened.  Each
of :data:`SWAP_KEYS` is reported (0 where nothing was counted), each device the swapper has
seen reports every ``policy.*`` key (None for what no step has taught yet), and
``guard.active`` is always there."""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict

from .guard import loaded_guard
from .state import DevState

__all__ = ["SWAP_KEYS", "swap_stats"]

# the swap.* counters reported as 0 where nothing was counted
SWAP_KEYS = ("out_bytes", "in_bytes", "out_count", "in_count", "kept_count",
             "kept_bytes", "small_count", "dedupe_hits", "prefetched",
             "prefetched_by_lesson", "prefetch_hits", "fetched_on_demand",
             "memory_queries", "planned_count", "reactive_count", "throttle_waits",
             "inflight_bounded",
             "tail_kept", "predicted_kept", "host_full_kept",
             "guard_fetched", "guard_forward_bytes", "guard_backward_bytes",
             "abandoned_rescues")


def swap_stats(counts: collections.Counter, throttle_s: float, dev: Dict[Any, DevState],
               prefetch_reserve: Callable[[DevState], int], pool: Any,
               guard: bool) -> Dict[str, Any]:
    """The statistics of a swapper: ``counts`` (all its counters, summed), ``throttle_s``
    (the time forward waited for its copies out), ``dev`` (its per-device states, by key),
    ``prefetch_reserve(st)`` (the forecast's prefetch headroom), ``pool`` (its host pool, or
    None before the first swap) and ``guard`` (whether the eviction net is asked for)."""
    out: Dict[str, Any] = {
        "swap." + k: v for k, v in sorted(counts.items())
    }
    out["swap.throttle_wait_ms"] = int(throttle_s * 1000)
    for key in SWAP_KEYS:
        out.setdefault("swap." + key, 0)
    for key, st in dev.items():
        tag = f"dev{key}" if key is not None else "cpu"
        out[f"policy.{tag}.margin_bytes"] = st.margin
        out[f"policy.{tag}.slack_bytes"] = st.slack
        out[f"policy.{tag}.device_limit_bytes"] = st.limit
        out[f"policy.{tag}.plan_bytes"] = st.plan
        out[f"policy.{tag}.prefetch_reserve_bytes"] = (
            prefetch_reserve(st) if st.largest else None)
        out[f"policy.{tag}.forward_end_bytes"] = st.fwd_end
        out[f"policy.{tag}.backward_peak_bytes"] = st.bwd_peak
        out[f"policy.{tag}.backward_lesson_pad_bytes"] = st.bwd.pad
        out[f"policy.{tag}.step_base_bytes"] = st.step_base
        out[f"policy.{tag}.base_extra_bytes"] = st.base_extra
        out[f"policy.{tag}.above_base_pad_bytes"] = st.above_base_pad
    if pool is not None:
        out.update(pool.stats())
    g = loaded_guard() if guard else None
    out["guard.active"] = int(g is not None and g.armed())
    if g is not None:
        out.update({"guard." + k: int(v) for k, v in g.stats().items()
                    if k != "armed"})
    return out
