"""Activation swapping under DDP and FSDP2 with NCCL on two GPUs (torchrun).

DDP all-reduces gradient buckets and FSDP all-gathers parameters and reduce-scatters
gradients on NCCL's streams while backward brings swapped tensors back on lms_swap's copy
stream: losses, gradients and parameters must be bit for bit those of the same job without
swapping.  Skipped with fewer than two GPUs.  (On CPU with gloo: tests/test_lms_swap_ddp.py.)
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

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    out = tmp_path_factory.mktemp("distributed")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    env.pop("PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB", None)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(WORKER), str(out)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_bitwise_equal_with_every_tensor_swapped(ranks, engine):
    for r in ranks:
        stock, lms = r[f"{engine}/stock"], r[f"{engine}/lms"]
        assert lms["swapped"] > 0 and lms["fetched"] > 0
        assert lms["host_in_use"] == 0
        assert lms["losses"] == stock["losses"]
        assert lms["grads"] == stock["grads"]
        assert lms["params"] == stock["params"]
    # the ranks trained on different data
    assert ranks[0][f"{engine}/lms"]["losses"] != ranks[1][f"{engine}/lms"]["losses"]


def test_ddp_ranks_agree_on_gradients(ranks):
    assert ranks[0]["ddp/lms"]["grads"] == ranks[1]["ddp/lms"]["grads"]
    assert ranks[0]["ddp/lms"]["params"] == ranks[1]["ddp/lms"]["params"]


def test_ranks_of_a_node_share_its_host_budget(ranks):
    for r in ranks:
        assert r["default_host_limit"] == int(r["host_total"] * 0.80) // 2
