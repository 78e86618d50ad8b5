"""The CPU swapper the CPU tests of lms_swap share (tests/test_lms_swap_*.py): its whole pack /
unpack / prefetch / release machinery on CPU tensors, the host pool unpinned."""
from __future__ import annotations

import torch

MiB = 1 << 20


def cpu_swapper(m, **kw):
    """An ActivationSwapper of the lms_swap module ``m`` (the ``m`` fixture) on CPU tensors,
    swapping every tensor of 4 KiB or more into a 256 MiB host pool (each a default)."""
    kw.setdefault("policy", "always")
    kw.setdefault("size_threshold", 4096)
    kw.setdefault("host_limit", 256 * MiB)
    kw.setdefault("host_min_available", 0)
    return m.ActivationSwapper(device_type="cpu", **kw)


def assert_equal_tensors(a, b):
    """Two lists of tensors (losses, gradients) equal element for element, bit for bit."""
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
