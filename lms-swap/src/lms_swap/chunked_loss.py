"""A language model's loss in pieces, for the one transient no swapping can make room for.

With activation checkpointing a decoder saves little, and its largest memory is the loss:
``F.cross_entropy`` over fp32 logits of ``tokens x vocabulary`` keeps its log-softmax
(the size of the logits) for backward, and its backward holds that, the incoming gradient
and its result at once: three tensors of the logits' size that one kernel needs together.
On an H100 a Llama of 12 layers with Hugging Face's checkpointing at 1.5x stock's
largest batch needs 3 x 26.4 GiB there, more than the card, whatever is moved to the host.

:func:`cross_entropy` computes the same loss row block by row block: forward keeps the
input (which the caller holds anyway) and one log-sum-exp per row; backward writes the
gradient block by block from them.  At most the input and its gradient are alive, plus a
block; and where the input came back from host memory as a tensor nobody else holds (the
swapper says so through :func:`hand_over`), the gradient is written over it, block by
block, so backward needs no second tensor of the logits' size (a checkpointed Llama at
twice stock's batch needed 2 x 35 GiB there on an H100, beside AdamW's state).  The
values are those of the same formula (log-sum-exp minus the target's logit; softmax
minus one-hot), rounded in another order: not bitwise equal to stock's kernels.
So the swapper uses it only where stock's could not fit (``chunked_loss="auto"``: the
allocation now plus one and a half more tensors of the input's size would be over
what the caching allocator can have) and counts each use (``swap.chunked_losses``); ``chunked_loss=False`` never does,
``True`` always does for inputs of at least ``MIN_BYTES``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

__all__ = ["cross_entropy", "supported", "hand_over", "MIN_BYTES"]

MIN_BYTES = 256 << 20  # smaller losses are never worth it
BLOCK_BYTES = 512 << 20  # fp32 bytes of one block of rows

# storages handed over by their only holder (hand_over): StorageImpl address -> weak ref
_HANDED: Dict[int, Any] = {}


def hand_over(t: torch.Tensor) -> None:
    """Says that ``t`` (the whole of its storage) is held by nobody but the one caller
    it is about to be given to, and will not be asked for again (a saved tensor fetched
    back from host memory, which a second backward would fetch anew): backward may
    write the loss's gradient over it."""
    from torch.multiprocessing.reductions import StorageWeakRef
    for k in [k for k, r in _HANDED.items() if r.expired()]:
        del _HANDED[k]
    ref = StorageWeakRef(t.untyped_storage())
    _HANDED[ref.cdata] = ref


def _taken(x: torch.Tensor) -> bool:
    """Whether ``x`` was handed over (see :func:`hand_over`) and is the whole of that
    storage; forgets it either way."""
    try:
        cdata = x.untyped_storage()._cdata
    except Exception:
        return False
    ref = _HANDED.pop(cdata, None)
    return (ref is not None and not ref.expired() and x.storage_offset() == 0
            and x.is_contiguous()
            and x.numel() * x.element_size() == x.untyped_storage().nbytes())


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, ignore_index: int,
                mean: bool) -> torch.Tensor:
        n, c = x.shape
        rows = max(1, BLOCK_BYTES // (4 * max(1, c)))
        lse = torch.empty(n, dtype=torch.float32, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        valid = target != ignore_index
        for s in range(0, n, rows):
            xb = x[s:s + rows].float()
            tb = target[s:s + rows]
            lse[s:s + rows] = torch.logsumexp(xb, dim=1)
            picked = xb.gather(1, tb.clamp(min=0).unsqueeze(1)).squeeze(1)
            total += ((lse[s:s + rows] - picked) * valid[s:s + rows]).sum()
            del xb
        count = valid.sum()
        ctx.save_for_backward(x, target, lse, count)
        ctx.ignore_index, ctx.mean, ctx.rows = ignore_index, mean, rows
        return total / count if mean else total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, target, lse, count = ctx.saved_tensors
        scale = grad / count if ctx.mean else grad
        # each block reads only its own rows before it writes them
        out = x if _taken(x) else torch.empty_like(x)
        rows = ctx.rows
        for s in range(0, x.shape[0], rows):
            tb = target[s:s + rows]
            valid = (tb != ctx.ignore_index).unsqueeze(1)
            p = torch.exp(x[s:s + rows].float() - lse[s:s + rows].unsqueeze(1))
            p.scatter_add_(1, tb.clamp(min=0).unsqueeze(1),
                           torch.full((p.shape[0], 1), -1.0, device=p.device))
            out[s:s + rows] = (p * valid * scale).to(out.dtype)
            del p
        return out, None, None, None


def supported(x: Any, target: Any, weight: Any = None, size_average: Any = None,
              ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
              label_smoothing: float = 0.0) -> bool:
    """Whether this call of ``F.cross_entropy`` is one :func:`cross_entropy` computes:
    class-index targets over 2-D fp32 logits that need a gradient, mean or sum, no
    class weights, no label smoothing."""
    return (isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor)
            and x.dim() == 2 and target.dim() == 1 and x.dtype == torch.float32
            and not target.is_floating_point() and x.requires_grad
            and torch.is_grad_enabled() and weight is None and size_average is None
            and reduce is None and reduction in ("mean", "sum") and not label_smoothing
            and type(x) is torch.Tensor)


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(x, target, ignore_index=..., reduction=...)`` computed in blocks
    of rows (see the module docstring)."""
    return _ChunkedCrossEntropy.apply(x, target, int(ignore_index), reduction == "mean")


class LossPatch:
    """Puts a chunking ``F.cross_entropy`` in place while any swapper is entered, and
    the original back when the last one leaves.  ``decide(x)`` says whether a supported
    call is chunked; calls in threads without swapping, under torch.compile, or that
    :func:`supported` refuses go to the original unchanged."""

    def __init__(self) -> None:
        self._users = 0
        self._orig: Optional[Callable] = None

    def enter(self, decide: Callable[[torch.Tensor], bool]) -> None:
        import torch.nn.functional as F
        if self._users == 0:
            orig = self._orig = F.cross_entropy

            def patched(input, target, *a, **kw):  # noqa: A002  (F's own names)
                if not torch.compiler.is_compiling():
                    try:
                        ok = supported(input, target, *a, **kw)
                    except TypeError:
                        ok = False
                    if ok and decide(input):
                        ignore = kw.get("ignore_index", a[2] if len(a) > 2 else -100)
                        red = kw.get("reduction", a[4] if len(a) > 4 else "mean")
                        return cross_entropy(input, target, ignore, red)
                return orig(input, target, *a, **kw)
            patched.__wrapped__ = orig
            patched.__doc__ = orig.__doc__
            F.cross_entropy = patched
        self._users += 1

    def exit(self) -> None:
        import torch.nn.functional as F
        self._users -= 1
        if self._users == 0 and self._orig is not None:
            F.cross_entropy = self._orig
            self._orig = None
