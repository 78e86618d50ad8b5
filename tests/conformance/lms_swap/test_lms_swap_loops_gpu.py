"""GPU tests of the training loops people run (examples/pytorch/benchmarks/loops.py), with
unmodified library models and lms_swap's defaults.

    python -m pytest -m gpu tests/conformance/lms_swap/test_lms_swap_loops_gpu.py -v

The batches are those measured on an 80 GB H100 (stock's largest for each loop), scaled to
this device's memory.
"""
from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

BENCH = pathlib.Path(__file__).resolve().parents[3] / "examples" / "pytorch" / "benchmarks"
H100_BYTES = 85_017_853_952  # torch.cuda.get_device_properties(0).total_memory on the H100


def _loops():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(BENCH))
    import loops
    return loops


def _batch(h100_batch):
    total = torch.cuda.get_device_properties(0).total_memory
    return max(1, int(h100_batch * total / H100_BYTES))


def test_checkpointed_decoder_trains_past_stock(lms_swap, cuda_clean):
    """Hugging Face's gradient checkpointing on a Llama at 1.5x stock's largest batch (72
    on the H100): stock's loss alone needs three tensors of the fp32 logits' size at once
    in backward, more than the card.  It must train (on aa0b3d8: CUDA out of memory in
    the first step), with the loss computed in pieces."""
    loops = _loops()
    loop = loops.build("ckpt-decoder", _batch(108))
    lms_swap.reset_stats()
    for i in range(3):
        loop.step(i, lms_swap.swapping)
    torch.cuda.synchronize()
    st = lms_swap.stats()
    assert st["swap.chunked_losses"] == 3
    assert st["swap.backward_saves"] > 0  # the recomputed layers, kept for backward
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())


def test_checkpointed_decoder_at_stock_batch_keeps_stock_loss(lms_swap, cuda_clean):
    """At the batch stock trains the loss is stock's own (not computed in pieces)."""
    loops = _loops()
    loop = loops.build("ckpt-decoder", _batch(72))
    lms_swap.reset_stats()
    for i in range(2):
        loop.step(i, lms_swap.swapping)
    assert lms_swap.stats().get("swap.chunked_losses", 0) == 0
