"""A first step that needs twice what fits, under a host memory limit (the GPU torture run):
    python host_limit_torture.py LAYERS     (PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB sets the limit)

An MLP of LAYERS blocks (Linear 4096x4096 + GELU over 32768 rows, fp32: 1 GiB saved per
block) trains 3 SGD steps with activation swapping at its defaults.  Ballast leaves the
device half of what a normal step needs, so the first step, which has nothing to learn
from, must move half its saved tensors to host memory at once, through the plan or the
eviction net.  With the limit below that half, the run must end in LMSHostMemoryError; with
it above, the steps must train bit for bit as a run with the device to itself did.

The host memory the process touched is measured by the kernel: ``/proc/self/clear_refs``
resets the resident-set peak (VmHWM) just before the swapped run, and VmHWM after it, less
VmRSS at that reset, is what swapping added.  Prints one JSON line; exits 0 whatever the
outcome (the caller judges it), so that only a crash or the kernel's OOM killer gives
another exit status.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import torch

GiB = 1 << 30
N, H, STEPS = 32768, 4096, 3


def load_lms_swap():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from swap_package import import_lms_swap  # the checkout's package, or the installed one
    return import_lms_swap()


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(H, H), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks).cuda()


def train(net, x, ctx=None):
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    losses = []
    for train.step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        if ctx is not None:
            with ctx:
                loss = net(x).pow(2).mean()
        else:
            loss = net(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, [p.detach().clone() for p in net.parameters()]


def main(layers: int) -> dict:
    x = torch.randn(N, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ref_losses, ref_params = train(model(layers), x)
    need = torch.cuda.max_memory_allocated() - base
    ref_params = [p.cpu() for p in ref_params]
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    ballast = torch.empty(free - need // 2, dtype=torch.uint8, device="cuda")
    lms = load_lms_swap()
    sw = lms.ActivationSwapper()  # defaults; the limit comes from the environment
    net = model(layers)
    out = {"layers": layers, "step_need_gib": need / GiB, "device_room_gib": need // 2 / GiB,
           "ballast_gib": ballast.numel() / GiB,
           "host_limit_mb": os.environ.get("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB")}
    rss0 = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    try:
        losses, params = train(net, x, sw)
        out["result"] = "trained"
        out["bitwise_equal"] = losses == ref_losses and all(
            torch.equal(p.cpu(), q) for p, q in zip(params, ref_params))
    except torch.OutOfMemoryError as e:
        out.update(result=type(e).__name__, step=train.step, error=str(e)[:1500])
    out["rss_before_gib"] = rss0 / (1 << 20)
    out["rss_added_gib"] = (status_kib("VmHWM") - rss0) / (1 << 20)
    out["stats"] = {k: v for k, v in sw.stats().items()
                    if k.startswith(("guard.", "swap.out", "swap.in", "host."))}
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(json.dumps(main(int(sys.argv[1]))), flush=True)
