"""One rank of test_lms_swap_distributed_gpu.py (started by torchrun, NCCL).

For DDP and FSDP2 (``fully_shard``) it trains the same small ConvNet three steps without
swapping and with every saved tensor swapped (``policy="always"``), each rank on its own
data, and writes what the test compares: losses, this rank's gradients (FSDP: its shards)
and parameters after the steps, bit for bit, and the swapper's counters.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

REPO = pathlib.Path(__file__).resolve().parents[3]
MiB = 1 << 20


def _net():
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True)]
    for _ in range(4):
        layers += [nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)]
    return nn.Sequential(*layers).cuda()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _bits(t):
    """The tensor's bytes as a list of ints: exact through JSON."""
    return _local(t).detach().float().cpu().view(torch.int32).flatten().tolist()


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    sys.path.insert(0, str(REPO / "examples" / "pytorch"))  # ddp_lms
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from ddp_lms import wrap  # the example's DDP / fully_shard wrapping
    from swap_package import import_lms_swap  # the checkout's package, or the installed one
    lms_swap = import_lms_swap()
    g = torch.Generator(device="cuda").manual_seed(100 + rank)   # each rank its own data
    x = torch.randn(32, 3, 96, 96, device="cuda", generator=g)
    y = torch.randint(0, 10, (32,), device="cuda", generator=g)
    res = {"rank": rank, "world": dist.get_world_size()}
    for engine in ("ddp", "fsdp"):
        for mode in ("stock", "lms"):
            # small DDP buckets (FSDP ignores the option): several all-reduces run while
            # backward brings tensors back
            model = wrap(_net(), engine, local, bucket_cap_mb=1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            sw = lms_swap.ActivationSwapper(policy="always", size_threshold=64 * 1024)
            losses, grads = [], []
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                if mode == "lms":
                    with sw:
                        loss = nn.functional.cross_entropy(model(x), y)
                else:
                    loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                losses.append(_bits(loss.reshape(1)))
                grads = [_bits(p.grad) for p in model.parameters()]
                opt.step()
            torch.cuda.synchronize()
            st = sw.stats()
            res[f"{engine}/{mode}"] = {
                "losses": losses, "grads": grads,
                "params": [_bits(p) for p in model.parameters()],
                "swapped": st["swap.out_count"], "fetched": st["swap.in_count"],
                "host_in_use": st.get("host.in_use_bytes")}
            del model, opt, sw
    res["default_host_limit"] = lms_swap.ActivationSwapper()._host_limits()[0]
    res["host_total"] = lms_swap.host_total()
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
