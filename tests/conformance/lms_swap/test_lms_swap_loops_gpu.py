"""GPU tests of the training loops people run (examples/pytorch/benchmarks/loops.py), with
unmodified library models and lms_swap's defaults.

    python -m pytest -m gpu tests/conformance/lms_swap/test_lms_swap_loops_gpu.py -v

The batches are those measured on an 80 GB H100 (stock's largest for each loop).  A smaller
card scales them down; a larger one holds each worker to the H100's size
(examples/pytorch/benchmarks/device_cap.py), since the host need not grow with the card.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

HERE = pathlib.Path(__file__).resolve().parent
H100_BYTES = 85_017_853_952  # torch.cuda.get_device_properties(0).total_memory on the H100


def _run(loop, h100_batch, iters):
    """The loop in a process of its own (loop_worker.py), with the allocator settings a
    user of LMS runs: the counters it printed."""
    pytest.importorskip("transformers")
    total = torch.cuda.get_device_properties(0).total_memory
    batch = max(1, int(h100_batch * min(total, H100_BYTES) / H100_BYTES))
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    if total > H100_BYTES:
        env["LMS_BENCH_DEVICE_GIB"] = repr(H100_BYTES / (1 << 30))
    p = subprocess.run([sys.executable, str(HERE / "loop_worker.py"), loop, str(batch),
                        str(iters)], capture_output=True, text=True, env=env, timeout=600)
    lines = [x for x in p.stdout.splitlines() if x.startswith("LOOP ")]
    assert lines, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(lines[-1][5:])


def test_checkpointed_decoder_trains_past_stock(cuda_clean):
    """Hugging Face's gradient checkpointing on a Llama at 1.5x stock's largest batch (72
    on the H100): stock's loss alone needs three tensors of the fp32 logits' size at once
    in backward, more than the card.  It must train (on aa0b3d8: CUDA out of memory in
    the first step), with the loss computed in pieces.  (Hugging Face's checkpointing is
    non-reentrant here: transformers 5.17 binds ``checkpoint(use_reentrant=False)``, whose
    recomputation in backward is kept by checkpoint's own hooks, not this layer's; the
    reentrant kind's saves in backward are tests/test_lms_swap_loops.py's.)"""
    r = _run("ckpt-decoder", 108, 3)
    assert r["status"] == "ok" and r["done"] == 3 and r["finite"], r
    assert r["stats"]["swap.chunked_losses"] == 3


def test_checkpointed_decoder_trains_at_twice_stock(cuda_clean):
    """The same at 2.0x (144 on the H100): the chunked loss's backward needs its fp32
    input back (35 GiB) beside AdamW's state, and must write the gradient over it rather
    than beside it (on 5abbc16: CUDA out of memory in the second step's backward,
    asking for 35.16 GiB with 43.58 GiB allocated)."""
    r = _run("ckpt-decoder", 144, 3)
    assert r["status"] == "ok" and r["done"] == 3 and r["finite"], r
    assert r["stats"]["swap.chunked_losses"] == 3


def test_checkpointed_decoder_at_stock_batch_keeps_stock_loss(cuda_clean):
    """At the batch stock trains the loss is stock's own (not computed in pieces): what
    forward kept on the device and the net can move counts as room (on 5abbc16 the rule
    left it out and chunked the loss once in two iterations at 72 on the H100)."""
    r = _run("ckpt-decoder", 72, 2)
    assert r["status"] == "ok", r
    assert r["stats"].get("swap.chunked_losses", 0) == 0


def test_checkpointing_on_every_other_layer_trains_at_twice_stock(cuda_clean):
    """torch.utils.checkpoint (non-reentrant) on every other layer of the Llama, the rest
    saving all it saves, at 2.0x stock's largest batch that trains 30 iterations (24 on
    the H100): the checkpointed layers' inputs and the others' activations are swapped
    alike, and after a warm-up of 8 iterations the net stays quiet (the training-loops
    benchmark on 5e0db9a: 30 iterations, 8 interventions, all in warm-up)."""
    r = _run("ckpt-some", 48, 12)
    assert r["status"] == "ok" and r["done"] == 12 and r["finite"], r
    assert sum(r["net"][8:]) <= 1, r["net"]
    assert r["stats"]["swap.out_count"] > 0, r["stats"]


def test_a_loop_whose_sequence_length_cycles_leaves_the_net_quiet(cuda_clean):
    """Dynamic padding (six lengths up to 2048) with an evaluation pass under no_grad
    every 10th iteration and one with autograd on every 10th, on a Llama at 1.5x stock's
    largest batch for this loop (17 on the H100).  After a warm-up of 10 iterations the
    forecast follows the shapes: at most one intervention of the eviction net in the 20
    iterations after it.  (On 85e24e1 the forward after the evaluation pass with autograd
    on counted as its continuation: CUDA out of memory at 1.5x.  On 5abbc16 each
    evaluation pass with autograd on needed the net: it begins with the last step's
    gradients on the device, 2.8 GiB its shape's lesson did not know.)"""
    r = _run("varlen-decoder", 26, 30)
    assert r["status"] == "ok" and r["done"] == 30 and r["finite"], r
    after = list(zip(r["kind"], r["net"]))[10:]
    assert sum(n for _, n in after) <= 1, after
    assert r["stats"]["swap.forwards_abandoned"] >= 2, r["stats"]


def test_a_compiled_model_whose_graph_cannot_fit_says_so(cuda_clean):
    """ResNet-50 under torch.compile, one graph, at 2.0x stock's batch (1,841 on the
    H100): the saved-tensor hooks fire only when the compiled graph has run, so its own
    peak cannot be lowered.  The error must say so and what to do (on df7fc1c: a bare
    CUDA out of memory in the first forward); its blocks compiled one by one train
    (the training-loops benchmark's compiled-blocks rows)."""
    pytest.importorskip("torchvision")
    r = _run("compiled", 3682, 1)
    assert r["status"] == "CUDA OOM", r
    assert "inside a torch.compile'd graph" in r["error"] and "block.compile()" in r["error"], r
