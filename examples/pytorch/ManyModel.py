#!/usr/bin/env python3
"""Train many torchvision models on synthetic images, with or without LMS.

Examples (on a GPU machine, from the repository root):

    # ResNet-50 at 448x448, batch 600 (more than fits an 80 GB H100 without LMS)
    python examples/pytorch/ManyModel.py --arch resnet50 --image-size 448 --batch-size 600 --lms

    # find the largest batch that trains, without and with LMS
    python examples/pytorch/ManyModel.py --arch densenet121 --image-size 224 --search
    python examples/pytorch/ManyModel.py --arch densenet121 --image-size 224 --search --lms

    # see the swapping in a timeline (Nsight Systems), or with torch.profiler
    nsys run -t cuda,nvtx python examples/pytorch/ManyModel.py --arch resnet50 --lms --nvtx
    python examples/pytorch/ManyModel.py --arch resnet50 --lms --profile prof/

LMS here is activation swapping (torch.cuda.lms_swap on a PyTorch built with the LMS
patch, where --lms also switches on the allocator's LMS with torch.cuda.set_enabled_lms;
this repository's lms_swap package on a stock PyTorch).  Its tunables are options below.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODELS = {
    # name: (constructor name in torchvision.models, default image size)
    "resnet18": ("resnet18", 224), "resnet50": ("resnet50", 224),
    "resnet101": ("resnet101", 224), "resnet152": ("resnet152", 224),
    "wide_resnet50_2": ("wide_resnet50_2", 224), "resnext50_32x4d": ("resnext50_32x4d", 224),
    "densenet121": ("densenet121", 224), "densenet201": ("densenet201", 224),
    "mobilenet_v2": ("mobilenet_v2", 224), "mobilenet_v3_large": ("mobilenet_v3_large", 224),
    "inception_v3": ("inception_v3", 299), "googlenet": ("googlenet", 224),
    "vgg16": ("vgg16", 224), "efficientnet_b0": ("efficientnet_b0", 224),
    "convnext_tiny": ("convnext_tiny", 224), "regnet_y_8gf": ("regnet_y_8gf", 224),
    "vit_b_16": ("vit_b_16", 224), "swin_t": ("swin_t", 224),
}
GiB = 1 << 30


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", "-a", default="resnet50", choices=sorted(MODELS) + ["all"],
                   help="model ('all' trains each one in turn)")
    p.add_argument("--image-size", type=int, default=None, help="default: the model's usual size")
    p.add_argument("--batch-size", "-b", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="steps per epoch")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--amp", choices=["bf16", "fp16", "none"], default="bf16")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--search", action="store_true",
                   help="find the largest batch that trains (doubling, then bisection)")
    p.add_argument("--search-max", type=int, default=8192)
    lms = p.add_argument_group("LMS")
    lms.add_argument("--lms", action="store_true", help="enable LMS activation swapping")
    lms.add_argument("--lms-policy", choices=["auto", "always", "never"], default="auto")
    lms.add_argument("--lms-threshold-kb", type=int, default=1024,
                     help="tensors smaller than this stay on the device")
    lms.add_argument("--lms-limit-gb", type=float, default=None,
                     help="device allocation at which swapping starts (default: 98%% of the GPU)")
    lms.add_argument("--lms-prefetch", type=int, default=None,
                     help="most tensors fetched ahead in backward (default: lms_swap's, 16; "
                          "memory decides below that)")
    lms.add_argument("--lms-inflight-gb", type=float, default=2.0,
                     help="device GiB allowed to wait for copies to host before forward waits")
    lms.add_argument("--lms-host-limit-gb", type=float, default=None,
                     help="pinned host memory for swap (default: PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB or 80%% of RAM)")
    lms.add_argument("--lms-no-plan", action="store_true", help="only swap under pressure (no learned plan)")
    prof = p.add_argument_group("profiling")
    prof.add_argument("--nvtx", action="store_true", help="NVTX ranges per step/phase (for nsys)")
    prof.add_argument("--profile", metavar="DIR", default=None,
                      help="torch.profiler trace of steps 3-5 of the first epoch into DIR (TensorBoard/Perfetto)")
    return p.parse_args(argv)


def load_lms(args):
    from lms_swap_loader import load_lms_swap
    mod = load_lms_swap()
    kw = dict(policy=args.lms_policy, size_threshold=args.lms_threshold_kb * 1024,
              max_inflight_bytes=int(args.lms_inflight_gb * GiB), plan=not args.lms_no_plan)
    if args.lms_prefetch is not None:
        kw["prefetch_depth"] = args.lms_prefetch
    if args.lms_limit_gb:
        kw["device_limit"] = int(args.lms_limit_gb * GiB)
    if args.lms_host_limit_gb:
        kw["host_limit"] = int(args.lms_host_limit_gb * GiB)
    mod.configure(**kw)
    if hasattr(torch.cuda, "set_enabled_lms"):
        torch.cuda.set_enabled_lms(True)  # patched build: allocator LMS + enable()
    mod.enable()
    return mod


def build(arch, args, batch):
    import torchvision
    ctor, default_size = MODELS[arch]
    size = args.image_size or default_size
    kw = {"num_classes": args.num_classes}
    if arch == "inception_v3":
        kw["aux_logits"] = False
        kw["init_weights"] = False
    if arch == "googlenet":
        kw["aux_logits"] = False
        kw["init_weights"] = False
    model = getattr(torchvision.models, ctor)(**kw).cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device="cuda")
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, args.num_classes, (batch,), device="cuda")
    return model, x, y, size


def nvtx_range(args, name):
    return torch.cuda.nvtx.range(name) if args.nvtx else contextlib.nullcontext()


def train(arch, args, batch, lms, epochs, steps, quiet=False):
    model, x, y, size = build(arch, args, batch)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=amp is torch.float16)

    def step(i):
        with nvtx_range(args, f"step {i}"):
            opt.zero_grad(set_to_none=True)
            with nvtx_range(args, "forward"):
                with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
                    loss = F.cross_entropy(model(x), y)
            with nvtx_range(args, "backward"):
                scaler.scale(loss).backward()
            with nvtx_range(args, "optimizer"):
                scaler.step(opt)
                scaler.update()
        return loss

    if not quiet:
        print(f"== {arch} image {size}x{size} batch {batch} amp {args.amp} "
              f"{'LMS' if lms else 'no LMS'}", flush=True)
    profiler = None
    for epoch in range(epochs):
        torch.cuda.reset_peak_memory_stats()
        if lms:
            lms.reset_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            if args.profile and epoch == 0 and i == 2:
                profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                    on_trace_ready=torch.profiler.tensorboard_trace_handler(args.profile))
                profiler.__enter__()
            loss = step(i)
            if profiler is not None and i == 4:
                torch.cuda.synchronize()
                profiler.__exit__(None, None, None)
                profiler = None
                print(f"   profiler trace written to {args.profile}")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if not quiet:
            line = (f"epoch {epoch}: {steps * batch / dt:8.1f} img/s  {dt / steps * 1000:7.1f} ms/step  "
                    f"loss {loss.item():.4f}  peak GPU {torch.cuda.max_memory_allocated() / GiB:.1f} GiB "
                    f"(reserved {torch.cuda.max_memory_reserved() / GiB:.1f})")
            if lms:
                s = lms.stats()
                line += (f"  swapped out {s['swap.out_bytes'] / GiB / steps:.2f} GiB/step"
                         f"  in {s['swap.in_bytes'] / GiB / steps:.2f} GiB/step"
                         f"  host peak {s.get('host.peak_in_use_bytes', 0) / GiB:.1f} GiB"
                         f"  prefetch hits {s['swap.prefetch_hits']}/{s['swap.prefetch_hits'] + s['swap.fetched_on_demand']}"
                         f"  waits {s['swap.throttle_wait_ms']} ms")
            print(line, flush=True)
    model = x = y = opt = None  # free before the next model
    return True


def fits(arch, args, batch, lms):
    try:
        train(arch, args, batch, lms, epochs=1, steps=3, quiet=True)
        ok = True
    except torch.OutOfMemoryError as e:  # LMSHostMemoryError is one too
        ok = False
        why = str(e).splitlines()[0][:120]
    gc.collect()
    torch.cuda.empty_cache()
    if lms:
        lms.empty_cache()
    print(f"   batch {batch:6d}: {'trains' if ok else 'out of memory: ' + why}", flush=True)
    return ok


def search(arch, args, lms):
    lo, hi = 0, None
    b = max(1, args.batch_size)
    while hi is None:
        if fits(arch, args, b, lms):
            lo = b
            b *= 2
            if b > args.search_max:
                hi = args.search_max + 1
        else:
            hi = b
    while hi - lo > max(1, lo // 64):
        mid = (lo + hi) // 2
        if fits(arch, args, mid, lms):
            lo = mid
        else:
            hi = mid
    print(f"largest batch that trains: {arch} {lo} ({'LMS' if lms else 'no LMS'})", flush=True)
    return lo


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ManyModel.py needs a CUDA GPU")
    lms = load_lms(args) if args.lms else None
    archs = sorted(MODELS) if args.arch == "all" else [args.arch]
    for arch in archs:
        try:
            if args.search:
                search(arch, args, lms)
            else:
                train(arch, args, args.batch_size, lms, args.epochs, args.steps)
        except torch.OutOfMemoryError as e:
            print(f"{arch}: out of memory: {str(e).splitlines()[0]}", flush=True)
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
