"""The training loops people run, as the "training loops" benchmark (bench_loops.py) and the
GPU tests run them: unmodified library models, each loop written the way a user writes it.

A loop is built by ``build(name, batch)`` and returns a :class:`Loop`: ``loop.step(i, ctx)``
runs iteration ``i`` (one optimizer step, or an evaluation pass where the loop has one)
with ``ctx()`` (the mode's context: stock, ``save_on_cpu``, lms_swap, torchtune's
offloading) around forward, and returns ``(kind, units)``: ``"train"`` or ``"eval"``, and
the tokens or images it processed.  ``loop.step(i, ctx, phase)`` also puts ``phase(name)``
around its "forward", "backward" and "optimizer" (as ``zoo.train_step`` does; what
profile_step.py times).  Nothing here knows about swapping.

Loops (``LOOPS``):

ckpt-decoder     zoo.py's Llama (12 layers, d=2048, seq 2048) with Hugging Face's
                 ``gradient_checkpointing_enable()`` (its defaults)
ckpt-some        the same with torch.utils.checkpoint (non-reentrant) on every other layer
                 only (a user checkpointing what does not fit).  The model keeps its default
                 ``use_cache=True``, as such a user gets (Hugging Face turns the cache off
                 only in its own checkpointing): every layer's keys and values stay in the
                 step's output until the step ends, in stock as under swapping, and each
                 checkpointed layer's recomputation adds them again
ckpt-logprobs    ckpt-decoder with the loss preference and RL fine-tuning code computes:
                 per-token log-probabilities, ``log_softmax`` over the fp32 logits and a
                 ``gather`` (no ``F.cross_entropy``, so no swapper's loss chunking applies).
                 Backward holds three fp32 tensors of the logits' size at once, beside the
                 optimizer state that activation swapping cannot move
varlen-decoder   the same Llama, no checkpointing; the sequence length changes every step
                 (dynamic padding: a cycle of six lengths up to 2048), an evaluation pass
                 under ``no_grad`` every 5th iteration and one with autograd on (no
                 backward) every 10th
vision-lastbatch torchvision ResNet-50 at 224x224, epochs of 4 batches whose last is short
                 (0.3 of the batch)
accum4           timm ViT-L/16 at 224, gradient accumulation over 4 micro-batches per
                 optimizer step (``batch`` is the micro-batch)
compiled         torchvision ResNet-50 at 224 under ``torch.compile`` (default mode), the
                 whole model one graph
compiled-blocks  the same with each of its blocks compiled on its own (``block.compile()``),
                 as memory-bound users compile (torchtune compiles per layer)
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Tuple

import torch
import torch.nn.functional as F

import zoo

DEV = "cuda"
VARLEN_CYCLE = (2048, 1024, 1536, 768, 1792, 1280)

# (lo, hi) of stock's largest batch search: lo fits on an 80 GB card, hi does not
SEARCH = {
    "ckpt-decoder": (8, 512),
    "ckpt-some": (8, 64),
    "ckpt-logprobs": (8, 512),
    "varlen-decoder": (1, 128),
    "vision-lastbatch": (32, 4096),
    "accum4": (8, 2048),
    "compiled": (32, 4096),
    "compiled-blocks": (32, 4096),
}
LOOPS = tuple(SEARCH)


@dataclasses.dataclass
class Loop:
    name: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    step: Callable[[int, Callable], Tuple[str, int]]
    unit: str


def _gen(seed=0):
    return torch.Generator(device=DEV).manual_seed(seed)


def _opt(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _llama(batch):
    from transformers import LlamaConfig, LlamaForCausalLM
    model, _, _, _ = zoo._decoder(LlamaConfig, LlamaForCausalLM, batch, num_key_value_heads=16)
    return model


def _hf_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def _logprob_loss(model, ids):
    """Per-token log-probabilities as preference and RL fine-tuning code takes them."""
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, ids[:, 1:, None]).mean()


def _ckpt_decoder(name, batch):
    """ckpt-decoder, ckpt-some or ckpt-logprobs: which layers are checkpointed, and how
    the loss is taken."""
    model = _llama(batch)
    if name == "ckpt-some":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper)
        layers = model.model.layers
        for i in range(0, len(layers), 2):
            layers[i] = checkpoint_wrapper(layers[i])
    else:
        model.gradient_checkpointing_enable()
    model.train()
    opt = _opt(model)
    ids = torch.randint(0, model.config.vocab_size, (batch, 2048), device=DEV, generator=_gen())
    loss = _logprob_loss if name == "ckpt-logprobs" else _hf_loss

    def step(i, ctx, phase=None):
        zoo.train_step(lambda: loss(model, ids), opt, ctx, phase)
        return "train", batch * 2048
    return Loop(name, model, opt, step, "tok/s")


def _varlen_decoder(batch):
    model = _llama(batch)
    opt = _opt(model)
    gen = _gen()
    vocab = model.config.vocab_size
    data = {s: torch.randint(0, vocab, (batch, s), device=DEV, generator=gen)
            for s in VARLEN_CYCLE}

    def step(i, ctx, phase=None):
        if i % 10 == 4 or i % 10 == 9:
            ids = data[max(VARLEN_CYCLE)]
            model.eval()
            grad = torch.enable_grad() if i % 10 == 9 else torch.no_grad()
            mark = (phase or zoo.no_phase)("forward")
            with mark, grad, torch.autocast("cuda", dtype=torch.bfloat16):
                with ctx():
                    loss = model(input_ids=ids, labels=ids).loss
            float(loss)
            del loss
            model.train()
            return "eval", ids.numel()
        ids = data[VARLEN_CYCLE[i % len(VARLEN_CYCLE)]]
        zoo.train_step(lambda: model(input_ids=ids, labels=ids).loss, opt, ctx, phase)
        return "train", ids.numel()
    return Loop("varlen-decoder", model, opt, step, "tok/s")


def _resnet(batch, compiled=False, blocks=False):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(DEV)
    run = torch.compile(model) if compiled and not blocks else model
    if blocks:
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            for block in stage:
                block.compile()
    opt = _opt(model)
    gen = _gen()
    x = torch.randn(batch, 3, 224, 224, device=DEV, generator=gen)
    y = torch.randint(0, 1000, (batch,), device=DEV, generator=gen)
    last = max(1, int(batch * 0.3))

    def step(i, ctx, phase=None):
        n = last if (not compiled and i % 4 == 3) else batch
        zoo.train_step(lambda: F.cross_entropy(run(x[:n]), y[:n]), opt, ctx, phase)
        return "train", n
    name = "compiled-blocks" if blocks else "compiled" if compiled else "vision-lastbatch"
    return Loop(name, model, opt, step, "img/s")


def _accum4(batch):
    import timm
    torch.manual_seed(0)
    model = timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=1000).to(DEV)
    opt = _opt(model)
    gen = _gen()
    xs = [torch.randn(batch, 3, 224, 224, device=DEV, generator=gen) for _ in range(4)]
    ys = [torch.randint(0, 1000, (batch,), device=DEV, generator=gen) for _ in range(4)]

    def step(i, ctx, phase=None):
        phase = phase or zoo.no_phase
        opt.zero_grad(set_to_none=True)
        for x, y in zip(xs, ys):
            with phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                with ctx():
                    loss = F.cross_entropy(model(x), y) / len(xs)
            with phase("backward"):
                loss.backward()
        with phase("optimizer"):
            opt.step()
        return "train", batch * len(xs)
    return Loop("accum4", model, opt, step, "img/s")


def build(name: str, batch: int) -> Loop:
    if name in ("ckpt-decoder", "ckpt-some", "ckpt-logprobs"):
        return _ckpt_decoder(name, batch)
    if name == "varlen-decoder":
        return _varlen_decoder(batch)
    if name in ("vision-lastbatch", "compiled", "compiled-blocks"):
        return _resnet(batch, compiled=name != "vision-lastbatch",
                       blocks=name == "compiled-blocks")
    if name == "accum4":
        return _accum4(batch)
    raise SystemExit(f"unknown loop {name!r}; known: {', '.join(LOOPS)}")


def fits(name: str, batch: int, steps: int = 0) -> bool:
    """Whether stock PyTorch runs ``steps`` iterations of the loop (default: one cycle of
    its shapes, at least 8) at ``batch`` without CUDA out of memory.  (Four were too few:
    ckpt-some at the batch they passed, 27, ran out of memory in stock's fifth step on
    the H100, as the caching allocator's blocks split further.)"""
    steps = steps or {"varlen-decoder": 10}.get(name, 8)
    loop = None
    try:
        loop = build(name, batch)
        for i in range(steps):
            loop.step(i, contextlib.nullcontext)
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        loop = None
        import gc
        gc.collect()
        torch.cuda.empty_cache()
