"""A training job whose memory forecast is wrong on purpose (run by test_lms_swap_guard.py).

    python forecast_wrong.py MODE   (MODE: stock | noguard | guard | first2x)

An MLP trains 8 SGD steps.  At the end of forward, where the step's memory peaks, the
model makes a transient (a concatenation of copies of its output, dropped at once); from
step 5 on it is 3x what it was while the policy settled (1.5 GiB instead of 512 MiB).
Ballast leaves the device room for a normal step and 256 MiB more, so that step is more
than the device holds.
The swapping policy is told the device is twice its size (``device_limit``), so it never
swaps: whatever saves the step is the eviction net.  First, with the device to itself, a
reference run records every loss and the final weights; the run under ballast must match
it bit for bit.  Prints one JSON line.

MODE first2x: no jump, but the ballast leaves only half of what a normal step needs, and
swapping runs with its defaults (no ``device_limit``): the first step, which has nothing
to learn from, needs 2x what fits; the later steps must plan from what the net moved.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import torch

GiB = 1 << 30
REPO = pathlib.Path(__file__).resolve().parents[3]
N, H, LAYERS, STEPS, JUMP_AT = 16384, 4096, 8, 8, 5


def load_lms_swap():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from swap_package import import_lms_swap  # the checkout's package, or the installed one
    return import_lms_swap()


def model():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(H, H), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda()


def train(net, x, ctx=None, jump=True, evicted=None):
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        train.step = step + 1
        k = 6 if (jump and step + 1 >= JUMP_AT) else 2
        opt.zero_grad(set_to_none=True)
        if ctx is not None:
            ctx.__enter__()
        h = x
        for i, layer in enumerate(net):
            h = layer(h)
            if i == 2 * LAYERS - 1:
                # the transient: k copies, one kept (every k gives the same values)
                h = torch.cat([h] * k).view(k, N, H)[0].clone()
        loss = h.float().pow(2).mean()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if evicted is not None:
            evicted.append(ctx.stats().get("guard.evicted_bytes", 0))
    torch.cuda.synchronize()
    return losses, [p.detach().clone() for p in net.parameters()]


def main(mode: str) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(N, H, device="cuda", generator=g)
    ref_losses, ref_params = train(model(), x, jump=False)
    ref_params = [p.cpu() for p in ref_params]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    train(model(), x, jump=False)             # one normal run, to measure its peak
    need = torch.cuda.max_memory_allocated() - base
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    room = need // 2 if mode == "first2x" else need + GiB // 4
    ballast = torch.empty(free - room, dtype=torch.uint8, device="cuda")
    out = {"mode": mode, "normal_peak_gib": need / GiB, "ballast_gib": ballast.numel() / GiB}
    ctx = None
    if mode != "stock":
        lms = load_lms_swap()
        if mode == "first2x":
            ctx = lms.ActivationSwapper()  # defaults
        else:
            ctx = lms.ActivationSwapper(device_limit=2 * total, guard=(mode == "guard"))
    evicted = [] if ctx is not None else None
    try:
        losses, params = train(model(), x, ctx, jump=(mode != "first2x"), evicted=evicted)
        out["result"] = "trained"
        out["bitwise_equal"] = (losses == ref_losses and all(
            torch.equal(p.cpu(), q) for p, q in zip(params, ref_params)))
    except torch.OutOfMemoryError as e:
        out.update(result="oom", oom_step=train.step, error=str(e).splitlines()[0][:200])
    if ctx is not None:
        out["stats"] = {k: v for k, v in ctx.stats().items() if k.startswith(("guard.", "swap."))}
        out["evicted_by_step"] = evicted
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    print(json.dumps(main(sys.argv[1])), flush=True)
