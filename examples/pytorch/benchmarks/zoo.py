"""The model zoo of the activation-swapping benchmark: unmodified library models, built
from configs (no downloads), each with the loss its library gives it.

Every model is trained the same way (bench_lms_swap.py's child: AdamW, bf16 autocast,
default memory format), and nothing here knows about swapping: the workload is what a
user would run.  ``build(name, batch)`` returns ``(model, loss_fn, units, unit)``
(``loss_fn(m=model)``: a wrapper such as DistributedDataParallel can be passed as ``m``);
``SEARCH[name]`` is the batch range in which stock's largest batch is searched.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "cuda"

# (lo, hi): lo fits on an 80 GB card, hi does not (the search bisects between them)
SEARCH = {
    "llama": (1, 128),
    "mistral-gqa": (1, 128),
    # the three configurations the "It trains" issue was filed with (never tuned on)
    "llama-1b": (1, 64),
    "vit-l-448": (8, 1024),
    "efficientnet-b7": (4, 512),
    "t5": (4, 1024),
    "vit-l": (8, 2048),
    "efficientnet-b3": (8, 2048),
    "resnet50": (32, 4096),
    "unet": (2, 1024),
}
MODELS = tuple(SEARCH)


def largest_batch(fits, lo, hi):
    """The largest batch in [lo, hi) for which ``fits(batch)`` holds, to 1/32, assuming
    it holds at lo (checked: None where it does not) and not at hi."""
    if not fits(lo):
        return None
    best = lo
    while hi - best > max(1, best // 32):
        mid = (best + hi) // 2
        if fits(mid):
            best = mid
        else:
            hi = mid
    return best


def no_phase(_name):
    """The phase marker where nobody asked for one (see train_step): nothing."""
    return contextlib.nullcontext()


def train_step(loss_fn, opt, ctx, phase=None):
    """One training step, as the benchmarks, profile_step.py and ../ddp_lms.py run every
    model: bf16 autocast, the mode's context (``ctx()``, e.g. lms_swap.swapping) around
    forward.  ``phase(name)``, when given, returns a context manager put around
    "forward", "backward" and "optimizer"."""
    phase = phase or no_phase
    opt.zero_grad(set_to_none=True)
    with phase("forward"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with ctx():
                loss = loss_fn()
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        opt.step()
    return loss


def _gen():
    return torch.Generator(device=DEV).manual_seed(0)


def _decoder(config_cls, model_cls, batch, seq=2048, **kw):
    sizes = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
                 num_attention_heads=16, vocab_size=32000)
    sizes.update(kw)
    cfg = config_cls(max_position_embeddings=seq, **sizes)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(cfg).to(DEV)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=DEV, generator=_gen())

    def loss_fn(m=model):
        return m(input_ids=ids, labels=ids).loss

    return model, loss_fn, batch * seq, "tok/s"


def _images(batch, size, channels=3):
    return torch.randn(batch, channels, size, size, device=DEV, generator=_gen())


class UNet(nn.Module):
    """A plain UNet (4 levels, 64 base channels) for binary segmentation."""

    def __init__(self, cin=3, cout=1, base=64, levels=4):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o),
                                 nn.ReLU(inplace=True),
                                 nn.Conv2d(o, o, 3, padding=1, bias=False), nn.BatchNorm2d(o),
                                 nn.ReLU(inplace=True))

        chans = [base * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList([block(cin, chans[0])] +
                                  [block(chans[i], chans[i + 1]) for i in range(levels)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2)
                                for i in reversed(range(levels)))
        self.merge = nn.ModuleList(block(2 * chans[i], chans[i]) for i in reversed(range(levels)))
        self.head = nn.Conv2d(chans[0], cout, 1)

    def forward(self, x):
        skips = []
        for i, blk in enumerate(self.down):
            x = blk(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        x = skips.pop()
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], 1))
        return self.head(x)


def build(name, batch):
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        return _decoder(LlamaConfig, LlamaForCausalLM, batch, num_key_value_heads=16)
    if name == "mistral-gqa":
        from transformers import MistralConfig, MistralForCausalLM
        return _decoder(MistralConfig, MistralForCausalLM, batch, num_key_value_heads=4)
    if name == "llama-1b":
        # TinyLlama-1.1B's published sizes (22 layers, 32 heads, 4 key/value heads), seq 4096
        from transformers import LlamaConfig, LlamaForCausalLM
        return _decoder(LlamaConfig, LlamaForCausalLM, batch, seq=4096, num_hidden_layers=22,
                        num_attention_heads=32, num_key_value_heads=4)
    if name == "t5":
        from transformers import T5Config, T5ForConditionalGeneration
        cfg = T5Config(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12,
                       num_heads=12, vocab_size=32128,
                       # t5-base's own values (newer transformers no longer default them)
                       decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(cfg).to(DEV)
        src = torch.randint(0, cfg.vocab_size, (batch, 512), device=DEV, generator=_gen())
        tgt = torch.randint(0, cfg.vocab_size, (batch, 128), device=DEV, generator=_gen())

        def loss_fn(m=model):
            return m(input_ids=src, labels=tgt).loss

        return model, loss_fn, batch * (512 + 128), "tok/s"
    if name in ("vit-l", "vit-l-448", "efficientnet-b3", "efficientnet-b7", "resnet50"):
        if name == "resnet50":
            import torchvision
            torch.manual_seed(0)
            model, size = torchvision.models.resnet50(), 224
        else:
            import timm
            torch.manual_seed(0)
            arch, size = {"vit-l": ("vit_large_patch16_224", 224),
                          "vit-l-448": ("vit_large_patch16_224", 448),
                          "efficientnet-b3": ("efficientnet_b3", 320),
                          "efficientnet-b7": ("efficientnet_b7", 600)}[name]
            extra = {"img_size": size} if arch.startswith("vit") else {}
            model = timm.create_model(arch, pretrained=False, num_classes=1000, **extra)
        model = model.to(DEV)
        x = _images(batch, size)
        y = torch.randint(0, 1000, (batch,), device=DEV, generator=_gen())

        def loss_fn(m=model):
            return F.cross_entropy(m(x), y)

        return model, loss_fn, batch, "img/s"
    if name == "unet":
        torch.manual_seed(0)
        model = UNet().to(DEV)
        x = _images(batch, 256)
        y = (torch.rand(batch, 1, 256, 256, device=DEV, generator=_gen()) > 0.5).float()

        def loss_fn(m=model):
            return F.binary_cross_entropy_with_logits(m(x), y)

        return model, loss_fn, batch, "img/s"
    raise SystemExit(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
