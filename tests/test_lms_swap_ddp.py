"""Activation swapping under DistributedDataParallel, on CPU (gloo, two processes).

DDP's gradient buckets are all-reduced from autograd hooks while backward runs, the
moment the swapper brings saved tensors back: losses and gradients must be bitwise the
same with swapping on every tensor (``policy="always"``) and without it. The same run on
GPUs with NCCL (and FSDP) is examples/pytorch/ddp_lms.py.
"""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip
import torch.distributed as dist

assert dist.is_available(), "this torch is built without torch.distributed (the pinned CPU wheel has it)"

REPO = pathlib.Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _rank_main(rank: int, world: int, rdzv: str, out: str) -> None:
    import os
    sys.path.insert(0, str(REPO / "lms-swap" / "src"))  # this checkout's package, installed or not
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    import lms_swap
    nn = torch.nn
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)
    try:
        results = {}
        for mode in ("stock", "lms"):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                  nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            g = torch.Generator().manual_seed(100 + rank)   # each rank its own data
            x = torch.randn(8, 3, 16, 16, generator=g)
            y = torch.randint(0, 10, (8,), generator=g)
            sw = lms_swap.ActivationSwapper(device_type="cpu", policy="always", size_threshold=4096,
                                            host_limit=256 * MiB, host_min_available=0)
            losses, grads = [], []
            for _ in range(3):
                opt.zero_grad()
                if mode == "lms":
                    with sw:
                        loss = torch.nn.functional.cross_entropy(ddp(x), y)
                else:
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                losses.append(loss.detach().double().item())
                grads.append([p.grad.detach().flatten().tolist() for p in ddp.parameters()])
                opt.step()
            st = sw.stats()
            results[mode] = {"losses": losses, "grads": grads,
                             "swapped": st["swap.out_count"], "in_use": st.get("host.in_use_bytes")}
        os.environ.pop(lms_swap.ENV_HOST_LIMIT, None)
        results["default_limit"] = lms_swap.ActivationSwapper(device_type="cpu")._host_limits()[0]
        results["host_total"] = lms_swap.host_total()
        pathlib.Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_ddp_losses_and_gradients_are_bitwise_equal_with_swapping(tmp_path):
    import torch.multiprocessing as mp
    world = 2
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, str(tmp_path / "rdzv"), str(outs[r])))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    res = [json.loads(o.read_text()) for o in outs]
    for r in res:
        assert r["lms"]["swapped"] > 0 and r["lms"]["in_use"] == 0
        assert r["lms"]["losses"] == r["stock"]["losses"]      # bitwise: floats through JSON
        assert r["lms"]["grads"] == r["stock"]["grads"]
    # DDP averaged the gradients: the ranks (different data) agree on them
    assert res[0]["lms"]["grads"] == res[1]["lms"]["grads"]
    assert res[0]["lms"]["losses"] != res[1]["lms"]["losses"]
    # the two ranks share the node's host memory: by default each gets half of 80% of it
    for r in res:
        assert r["default_limit"] == int(r["host_total"] * 0.80) // world


def _example():
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_lms", REPO / "examples" / "pytorch" / "ddp_lms.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_binds_a_rank_to_its_gpus_numa_node(tmp_path):
    import os
    ex = _example()
    assert ex.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:1b:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert ex.gpu_numa_node("0000:1B:00.0", tmp_path) == 1
    (dev / "numa_node").write_text("-1\n")                 # a machine with one node says -1
    assert ex.gpu_numa_node("0000:1b:00.0", tmp_path) is None
    assert ex.gpu_numa_node("0000:99:00.0", tmp_path) is None
    node = tmp_path / "devices" / "system" / "node" / "node1"
    node.mkdir(parents=True)
    mine = sorted(os.sched_getaffinity(0))
    (node / "cpulist").write_text(",".join(map(str, mine)) + "\n")
    assert ex.bind_to_numa_node(1, tmp_path) == mine and sorted(os.sched_getaffinity(0)) == mine
    assert ex.bind_to_numa_node(7, tmp_path) == []          # no such node: nothing changes
