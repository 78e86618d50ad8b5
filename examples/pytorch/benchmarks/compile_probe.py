"""What happens to a torch.compile'd model under LMS activation swapping: whether the
saved-tensor hooks fire, whether graphs break, and whether training stays bitwise equal to
the same compiled model without swapping.  Prints one JSON line.

    python compile_probe.py
"""
from __future__ import annotations

import json
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from lms_swap_loader import load_lms_swap  # noqa: E402


def run(ctx, steps=3):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cm = torch.compile(model)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
    y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = F.cross_entropy(cm(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return losses, [p.detach().clone() for p in model.parameters()]


def main():
    import contextlib
    torch._dynamo.config.cache_size_limit = 64
    lms = load_lms_swap(prefer_patched=False)
    ref_l, ref_p = run(contextlib.nullcontext)
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    out = {}
    try:
        l, p = run(lambda: lms.swapping(policy="always", size_threshold=1 << 16))
        st = lms.stats()
        out.update(status="ok", losses_equal=l == ref_l,
                   params_equal=all(torch.equal(a, b) for a, b in zip(p, ref_p)),
                   swapped=st.get("swap.out_count", 0), kept=st.get("swap.kept_count", 0),
                   graph_breaks=sum(counters["graph_break"].values()),
                   break_reasons=list(counters["graph_break"])[:5])
    except Exception as e:  # noqa: BLE001
        out.update(status=f"error: {type(e).__name__}", error=str(e)[:800])
    print("COMPILE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
