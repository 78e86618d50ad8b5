"""What the forecast learned, kept per shape of step.

A training loop whose shapes change (dynamic padding, a short last batch, an evaluation
pass between training steps) makes the step before a bad teacher: a plan learned from a
sequence of 1024 tokens swaps half of what a step of 2048 needs, and the eviction net then
moves the rest synchronously.  So the lessons of a step (the plan, the previous forward's
profile of saved bytes and growth, the margin factor and the largest saved tensor) are kept
under the step's signature: the shape and dtype of the first tensor its forward saves
(a language model's token ids, a vision model's input batch), which is what varies.

A step whose signature was seen before starts from that signature's lessons exactly.  A
new one starts from the lessons of the nearest signature at or above it (below it when
there is none: a forecast from a larger shape errs towards swapping), scaled by the ratio
of the two first tensors' element counts (activations grow with the tokens or pixels of
the batch); its own step then teaches it.  The plan is not scaled but moved by the saved
bytes the new shape adds or lacks: what must be swapped is what is saved less the room the
device has, and the room does not scale (on the H100 a decoder at 2.0x whose first step of
1792 tokens started from the 1536-token plan scaled by 7/6, 33.6 GB, needed 46.3 GB, and the
net moved 3 GB synchronously).  Its own step then teaches it.  Lessons are never carried
from one shape to another unscaled; what backward's memory did position by position
(:mod:`.backward_profile`) is kept for its exact shape only.

What a step finds on the device before it saves anything (parameters, optimizer state,
gradients left from the step before when an evaluation pass with autograd on comes between
optimizer steps) is not the shape's: each lesson keeps the allocation at its step's first
save (``taught_base``: that of the step whose backward taught the plan), and the forecast
swaps the difference on top of the plan where a step begins above it.  A forward dropped
without backward teaches the plan nothing, except where the eviction net had to rescue it:
what the net moved is then kept for the forwards of that shape that begin above the plan's
base (``above_base_pad``, exact shape only), or raises the plan where it began at it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

__all__ = ["ShapeProfiles", "signature"]

# the DevState fields that depend on the step's shape: byte counts scale with it; the
# margin factor k (a multiple of the largest tensor) and the allocation at the first save of
# the step that taught the plan (taught_base: parameters, optimizer state) do not
_SCALED = ("plan", "prev_saved", "largest")
_SCALED_LISTS = ("prev_off", "prev_growth")
_KEPT = ("k", "taught_base")
# what holds for this exact shape only (backward's memory by position): not scaled, not
# carried to another shape
_EXACT_ONLY = ("bwd_lesson", "above_base_pad")


def signature(t: Any) -> Tuple[Tuple[int, ...], str]:
    """The signature of a step whose forward saves ``t`` first."""
    return tuple(int(s) for s in t.shape), str(t.dtype)


def _units(sig: Tuple[Tuple[int, ...], str]) -> int:
    n = 1
    for s in sig[0]:
        n *= max(1, s)
    return n


class ShapeProfiles:
    """The forecast's lessons per step signature, for one device."""

    def __init__(self, limit: int = 64) -> None:
        self._by_sig: Dict[Tuple, Dict[str, Any]] = {}
        self._limit = limit  # signatures kept (a loop with ever-new shapes keeps the last)
        self.exact = 0
        self.scaled = 0

    def __len__(self) -> int:
        return len(self._by_sig)

    def save(self, st: Any) -> None:
        """Keeps what ``st`` learned from its last step under that step's signature."""
        if st.sig is None:
            return
        self._by_sig.pop(st.sig, None)  # (re-inserted last: the most recent is kept)
        prof = {f: getattr(st, f) for f in _SCALED + _KEPT}
        prof.update({f: getattr(st, f, None) for f in _EXACT_ONLY})
        prof.update({f: list(getattr(st, f)) for f in _SCALED_LISTS})
        self._by_sig[st.sig] = prof
        while len(self._by_sig) > self._limit:
            self._by_sig.pop(next(iter(self._by_sig)))

    def enter(self, st: Any, sig: Tuple) -> Optional[str]:
        """A forward with signature ``sig`` begins on ``st``: saves the last step's
        lessons under its own signature, then loads those of ``sig`` (exactly, or scaled
        from the nearest signature).  Returns "exact", "scaled" or None (nothing known
        yet: ``st`` is left as it is)."""
        self.save(st)
        st.sig = sig
        prof = self._by_sig.get(sig)
        how = "exact"
        ratio = 1.0
        if prof is None:
            if not self._by_sig:
                return None
            units = _units(sig)
            above = [s for s in self._by_sig if _units(s) >= units]
            near = (min(above, key=_units) if above
                    else max(self._by_sig, key=_units))
            prof = self._by_sig[near]
            ratio = units / max(1, _units(near))
            how = "scaled"
        for f in _SCALED:
            v = prof[f]
            setattr(st, f, None if v is None else int(v * ratio))
        if how == "scaled" and prof["plan"] is not None and prof["prev_saved"] is not None:
            st.plan = max(0, int(prof["plan"] + prof["prev_saved"] * (ratio - 1)))
        for f in _SCALED_LISTS:
            setattr(st, f, [int(v * ratio) for v in prof[f]])
        for f in _KEPT:
            setattr(st, f, prof[f])
        for f in _EXACT_ONLY:
            setattr(st, f, prof.get(f) if how == "exact" else None)
        if how == "exact":
            self.exact += 1
        else:
            self.scaled += 1
        return how
