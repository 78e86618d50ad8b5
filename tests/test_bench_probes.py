"""The benchmarks' probes on CPU: profile_step.py's analysis of a profiled step,
the eviction net's compile child, and backward_memory.py's summaries.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench_fixtures import BENCH, import_bench

pytest.importorskip("torch")  # bench_lms_swap imports the zoo, which imports torch


def _trace(path):
    """A profiled step as torch.profiler writes it, cut to what profile_step.py reads: the
    phase ranges, runtime calls with their correlation ids, kernels on the compute stream,
    copies on a side stream, and one allocation that blocks the CPU twice."""
    import gzip
    import json
    ev = []

    def x(name, ts, dur, cat="cpu_op", tid=1, **args):
        ev.append({"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid,
                   "args": args})

    x("lms_forward", 0, 1000, cat="user_annotation")
    x("lms_backward", 1000, 1000, cat="user_annotation")
    x("aten::empty_strided", 100, 600)
    x("cudaEventSynchronize", 200, 200, cat="cuda_runtime")
    x("cudaEventSynchronize", 400, 300, cat="cuda_runtime")
    for i, at in enumerate((10, 20, 800, 1100, 1200)):
        x("cudaLaunchKernel", at, 1, cat="cuda_runtime", correlation=i)
        x("k", at + 5, 50, cat="kernel", tid=7, stream=7, correlation=i)
    x("cudaMemcpyAsync", 30, 1, cat="cuda_runtime", correlation=9)
    x("Memcpy DtoH", 40, 500, cat="gpu_memcpy", tid=13, stream=13, correlation=9,
      bytes=27_000_000)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


def test_a_profile_s_figures_are_a_record_and_a_probes_row(tmp_path):
    """profile_step.py's analysis returns what it prints: the CPU's blocks by call and op,
    the compute stream's busy time and gaps per phase, the side stream's copies; a record of
    them is a row of the probes table."""
    ps = import_bench("profile_step")
    rt = import_bench("record_tables")
    _trace(tmp_path / "t.json.gz")
    out = ps.analyse(str(tmp_path / "t.json.gz"))
    assert out["blocking"] == {"cudaEventSynchronize in aten::empty_strided": {
        "count": 2, "ms": 0.5, "from_ms": 0.2, "to_ms": 0.7}}
    assert out["compute"]["busy_ms"] == 0.2 and out["compute"]["gaps"] == 1
    assert out["compute"]["largest_gaps"][0] == [0.1, 0.7, "forward"]
    assert out["phases"]["forward"]["busy_ms"] == 0.1
    side = out["side_streams"][0]
    assert side["gb"] == 0.03 and side["gb_s"] == 54.0 and side["launched"]["forward"]["copies"] == 1
    rec = {"run": "9", "date": "2026-12-01", "commit": "abc1234", "machine": {"gpu": "G"},
           "torch": "2.11", "probe": "profile_ckpt-some_36_lms", "data": {"profile": {
               "what": "ckpt-some", "batch": 36, "mode": "lms", "lms_options": [],
               "timed": [{"gpu_s": {"forward": 0.8, "backward": 0.75}, "step_s": 1.57,
                          "peak_gib": 71.2, "alloc_retries": {"forward": 1}}],
               "profiled_step": out}}}
    text = rt.write_table("probes", tmp_path / "probes.md", [rec]).read_text()
    assert ("| 9 | profile_ckpt-some_36_lms | profile_step.py | ckpt-some batch 36 lms: "
            "1.570-1.570 s a step (forward 0.800, backward 0.750 on the GPU); profiled: "
            "compute busy 0.2 of 1.2 ms, 1 gaps of 0.7 ms; copies 0.03 GB at 54.0 GB/s "
            "(0.0-0.5 ms); longest CPU block: 2x cudaEventSynchronize in aten::empty_strided, "
            "0.5 ms |") in text


@pytest.mark.parametrize("bench", ["bench_loops.py", "bench_lms_swap.py"])
@pytest.mark.parametrize("what", ["net", "allocator"])
def test_the_compile_child_answers_for_this_machine(bench, what):
    """The child each bench runs before its configurations compiles the eviction net or the
    pluggable allocator, or says why it cannot be had (on a machine without CUDA:
    unavailable, with the reason), as one RESULT line the parent reads."""
    p = subprocess.run([sys.executable, str(BENCH / bench), "--child", "--compile", what],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, p.stdout
    r = json.loads(lines[0][len("RESULT "):])
    if r[what] == "ready":
        assert r["s"] >= 0
    else:
        assert r[what] == "unavailable" and r["reason"]


def test_backward_memory_says_which_interval_set_backwards_peak(m):
    """backward_memory.py's summary of backwards recorded by lms_swap's BackwardProfile
    (through its observer): the peak before the first unpack moves with forward's end, one
    at backward's end does not, and the summary names the interval that was highest."""
    import lms_swap.backward_profile as bp
    tool = import_bench("backward_memory")
    GB = 10 ** 9
    events, at = [], [0]
    bp.observe(lambda kind, f: events.append((kind, f, at[0])))
    try:
        for step, end in enumerate((30 * GB, 45 * GB)):
            at[0] = step
            prof = bp.BackwardProfile()
            prof.begin(end)
            prof.boundary(70 * GB, 25 * GB, end + 10 * GB)   # the loss: 25 GB over the end
            prof.boundary(0, 5 * GB, 55 * GB)                # late: 55 GB whatever forward did
            prof.end(12 * GB, 0, 78 * GB)
    finally:
        bp.observe(None)
    first, second = [tool.summary(b) for b in tool.backwards(events)]
    assert first["step"] == 0 and second["step"] == 1
    assert first["highest"]["offset_gb"] == 0 and first["highest"]["peak_gb"] == 67
    assert first["over_forward_end_gb"] == 37
    assert second["highest"]["offset_gb"] is None and second["highest"]["peak_gb"] == 70
    assert second["over_forward_end_gb"] == 25
    text = tool.line(second, {"swap.out_bytes": 72 * GB})
    assert "highest 70.0 (interval 0 of 3, before the first unpack" in text, text
    rt = import_bench("record_tables")
    kind, figures = rt._probe({"backward_memory": {"what": "ckpt-some", "batch": 48,
                                                   "backwards": [first, second]}})
    assert kind == "backward_memory.py"
    assert "step 1: end 45.0, first 70.0, highest 70.0 (first), last 67.0 GB" in figures, figures
    _, figures = rt._probe({"backward_memory": {
        "what": "ckpt-some", "batch": 24, "mode": "stock", "backwards": [],
        "steps": [{"i": 0, "layers": [["model.layers.11", 30.0], ["model.layers.0", 41.5],
                                       ["lm_head", 52.0], ["model.layers.1", 44.0]]}]}})
    assert figures == "ckpt-some batch 24 stock: step 0 layers 30.0-52.0-44.0 GB", figures


def test_backward_memory_groups_what_is_live_by_where_it_was_allocated(m):
    """--live-step's summary: blocks of a real allocator snapshot's form grouped by the
    innermost frames outside torch's files, recomputation marked, those live at forward's
    end told apart by address and size; record_tables shows the largest groups."""
    tool = import_bench("backward_memory")
    GB = 10 ** 9
    # a library in a folder whose path names torch is the caller's, not torch's
    llama = {"filename": "/opt/torch/site-packages/transformers/models/llama/modeling_llama.py",
             "line": 90, "name": "forward"}
    recompute = {"filename": "/opt/torch/site-packages/torch/utils/checkpoint.py", "line": 1,
                 "name": "recompute_fn"}
    linear = {"filename": "/opt/torch/site-packages/torch/nn/modules/linear.py", "line": 5,
              "name": "forward"}

    def snap(*blocks):
        return {"segments": [{"blocks": [dict(b, state=b.get("state", "active_allocated"))
                                         for b in blocks]}]}
    torch_dir = "/opt/torch/site-packages/torch"
    forward_end = tool.live_blocks(snap(
        {"address": 0, "size": 3 * GB, "frames": [linear, llama]},
        {"address": 9 * GB, "size": GB, "frames": [], "state": "inactive"}), torch_dir)
    assert forward_end == [(0, 3 * GB, "modeling_llama.py:90 forward")]
    now = tool.live_blocks(snap(
        {"address": 0, "size": 3 * GB, "frames": [linear, llama]},
        {"address": 5 * GB, "size": 2 * GB, "frames": [linear, llama, recompute]},
        {"address": 7 * GB, "size": 2 * GB, "frames": [linear, llama, recompute]},
        {"address": 10 * GB, "size": GB, "frames": []}), torch_dir)
    live = tool.live_summary(forward_end, now)
    assert live["live_gb"] == 8 and live["from_forward_gb"] == 3
    assert live["groups"][0] == {"when": "backward",
                                 "site": "modeling_llama.py:90 forward [recomputed]",
                                 "gb": 4.0, "blocks": 2, "sizes_gb": [[2.0, 2]]}
    assert live["groups"][1]["when"] == "forward" and live["groups"][1]["gb"] == 3.0
    assert live["groups"][2]["site"] == "(no Python frame)"
    rt = import_bench("record_tables")
    _, figures = rt._probe({"backward_memory": {
        "what": "ckpt-some", "batch": 24, "mode": "stock", "backwards": [], "steps": [],
        "live": live, "live_step": 4, "live_layer": "model.layers.0"}})
    assert figures.startswith("ckpt-some batch 24 stock: live at step 4's model.layers.0: "
                              "8.0 GB (3.0 from forward's end; 4.0 backward modeling_llama.py"), figures


def test_backward_memory_watches_the_layers_of_a_models_stacks(m, monkeypatch):
    """watch_layers hooks each child with parameters of a ModuleList or Sequential, and each
    reports as backward reaches its output, last layer first (no GPU: the allocation reads 0)."""
    import torch
    tool = import_bench("backward_memory")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 1))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    net, seen = Net(), []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)  # (no GPU here)
    assert tool.watch_layers(net, torch, seen) == 4     # three layers, the head's Linear
    net(torch.randn(2, 4)).sum().backward()
    assert [x[0] for x in seen] == ["head.1", "layers.2", "layers.1", "layers.0"]
    with torch.no_grad():
        net(torch.randn(2, 4))
    assert len(seen) == 4
