"""Which modes a benchmark (bench_lms_swap.py, bench_loops.py) runs at which scales: stock
and save_on_cpu at ``--baseline-scales`` (stock does not fit above 1.0x), the swapping modes
at ``--lms-scales`` where given, else at every scale; and what compiled code the modes load."""
from __future__ import annotations

from typing import Optional, Sequence

__all__ = ["LAYERED", "PLUGGABLE", "SWAPPING", "compiled", "runs_at"]

# modes that swap: they get a bound
SWAPPING = ("lms", "pluggable", "pluggable+lms")
# modes with lms_swap's activation layer: its tunables (--lms-option) and its net apply
LAYERED = ("lms", "pluggable+lms")
# modes under the pluggable LMS allocator
PLUGGABLE = ("pluggable", "pluggable+lms")


def compiled(modes: Sequence[str]) -> list:
    """What ``modes`` load that is compiled on first use, in children.COMPILED's names: the
    eviction net (the activation layer's modes), the pluggable allocator."""
    return ([w for w, of in (("net", LAYERED), ("allocator", PLUGGABLE))
             if any(m in of for m in modes)])


def runs_at(mode: str, scale: float, baseline_scales: Sequence[float],
            lms_scales: Optional[Sequence[float]]) -> bool:
    """Whether ``mode`` runs at ``scale``."""
    if mode not in SWAPPING:
        return scale in baseline_scales
    return not lms_scales or scale in lms_scales
