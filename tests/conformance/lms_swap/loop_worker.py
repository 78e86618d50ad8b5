"""Runs iterations of a training loop of examples/pytorch/benchmarks/loops.py with LMS
activation swapping (defaults) in a process of its own, as a user would start it
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), and prints one JSON line: the
status, lms_swap's counters and the eviction net's interventions per iteration.  Run
by test_lms_swap_loops_gpu.py.

    python loop_worker.py LOOP BATCH ITERATIONS
"""
from __future__ import annotations

import json
import pathlib
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples" / "pytorch" / "benchmarks"))  # loops
from swap_package import import_lms_swap  # noqa: E402  (the checkout's package, or the installed one)
lms_swap = import_lms_swap()
import device_cap  # noqa: E402
import loops  # noqa: E402


def main():
    name, batch, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lms = lms_swap
    out = {"status": "ok", "done": 0, "device_cap": device_cap.apply(torch)}
    try:
        loop = loops.build(name, batch)
        out["net"], out["kind"] = [], []  # the eviction net's interventions, per iteration
        for i in range(iters):
            before = lms.stats().get("guard.ooms_caught", 0)
            kind, _ = loop.step(i, lms.swapping)
            out["net"].append(lms.stats().get("guard.ooms_caught", 0) - before)
            out["kind"].append(kind)
            out["done"] = i + 1
        torch.cuda.synchronize()
        out["finite"] = all(bool(torch.isfinite(p).all()) for p in loop.model.parameters())
    except torch.OutOfMemoryError as e:
        out.update(status="CUDA OOM", error=str(e)[:600])
    out["stats"] = {k: v for k, v in lms.stats().items() if isinstance(v, int)}
    print("LOOP " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
