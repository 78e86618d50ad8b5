"""What the saved-tensor hooks need to know of autograd and torch.compile around them: the
tensor to hand autograd for one they keep, whether the calling thread runs a backward, and
whether an out-of-memory error came from inside a compiled graph (with what to tell the user
then).

It keeps one invariant: a tensor the hooks keep goes back to autograd without its autograd
history, so that no node owns a tensor that owns the node; everything else here only reads."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["COMPILED_OOM", "in_backward", "in_compiled_graph", "no_history"]


def no_history(t: torch.Tensor) -> torch.Tensor:
    """What the pack hook returns for a tensor it keeps: the same data without its
    autograd history.  A saved tensor can be an output of the node that saves it (exp,
    sigmoid, ReLU save their result); returned with its history, the node would own a
    tensor that owns the node, a cycle through C++ that no garbage collection breaks.
    Backward frees it, but a graph that is dropped without a backward (an evaluation
    pass with autograd on, a loss never differentiated) then stayed on the device for
    good: 13 GiB per evaluation pass of a Llama at batch 4 on the H100.  Autograd puts
    the history back when it unpacks, as for any tensor a hook returns."""
    return t.detach() if t.requires_grad and not t.is_leaf else t


def in_backward() -> bool:
    """Whether the calling thread is running an autograd backward pass."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


COMPILED_OOM = (
    "CUDA out of memory inside a torch.compile'd graph. Activation swapping moves a "
    "compiled graph's saved tensors only when the whole graph has run (the saved-tensor "
    "hooks fire at its end), so it cannot lower the peak of one graph: compile smaller "
    "pieces (each block or layer: `for block in blocks: block.compile()`), or use the "
    "allocator's LMS (a patched PyTorch build), which moves memory inside graphs too. "
    "The error was: ")


def in_compiled_graph(tb: Any) -> bool:
    """Whether a traceback ran through code torch.compile generated."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if ("/torch/_inductor/" in name or "torchinductor_" in name
                or "/_aot_autograd/" in name):
            return True
        tb = tb.tb_next
    return False
