"""The victim-policy replay (examples/pytorch/benchmarks/victim_trace.py) on CPU: a real training
step of a small model traced at the dispatcher, then replayed under each policy."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "pytorch" / "benchmarks"))
import victim_trace as vt  # noqa: E402

RECORDS = REPO / "examples" / "pytorch" / "benchmarks" / "records"
TRACES = RECORDS / "traces"  # the recorded H100 traces (records/victim_trace.jsonl, run 137)


def _replays(run):
    """The simulate output recorded for each model in records/victim_trace.jsonl, run ``run``."""
    lines = [json.loads(x) for x in (RECORDS / "victim_trace.jsonl").read_text().splitlines() if x]
    return {r["model"]: r for r in lines if r["run"] == run}


def _trace(foreach=None):
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                            for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), foreach=foreach)
    x = torch.randn(128, 256)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    step()                                   # optimizer state exists before the traced step
    return vt.record_step(step, device_type="cpu")


@pytest.fixture(scope="module")
def trace():
    return _trace()


def test_trace_is_consistent(trace):
    sizes = {int(k) for k in trace["sizes"]}
    pre = set(trace["pre"])
    assert pre and pre <= sizes
    live, dead_seen = set(pre), set()
    for name, uses, news, dead in trace["ops"]:
        assert not set(uses) & dead_seen, name      # nothing is used after it died
        assert set(uses) <= live | set(news), name
        live |= set(news)
        live -= set(dead)
        dead_seen |= set(dead)
    # parameters (weights and biases) and AdamW's two states per parameter were there before
    assert len(pre) >= 3 * 16


def test_policies_move_nothing_when_the_step_fits_and_something_when_not(trace):
    peak = vt.peak_live_bytes(trace)
    for p in vt.POLICIES:
        r = vt.simulate(trace, peak, p)
        assert r["bytes_out"] == r["bytes_in"] == 0 and r["ops_over_capacity"] == 0, r
        r = vt.simulate(trace, peak // 2, p)
        assert r["bytes_out"] > 0 and r["bytes_in"] > 0 and r["ops_over_capacity"] == 0, r
        assert r["bytes_in"] <= r["bytes_out"]   # only what went out comes back
    with pytest.raises(ValueError, match="unknown policy"):
        vt.simulate(trace, peak, "random")


def test_framework_classes_are_what_the_framework_knows():
    """The framework-classes policy's classes: the optimizer's state and the gradients (needed at
    the optimizer step), the tensors saved for the backward pass, the rest. AdamW as on CUDA
    (foreach), where the H100 traces' optimizer phase starts at its first _foreach_ op."""
    trace = _trace(foreach=True)
    bwd, opt = vt.phases(trace)
    ops = trace["ops"]
    assert 0 < bwd < opt < len(ops)
    assert ops[bwd][0].startswith("ones_like") and ops[opt][0].startswith("_foreach_")
    cls = vt.block_classes(trace)
    made = {b: i for i, op in enumerate(ops) for b in op[2]}
    pre = set(trace["pre"])
    state = [b for b, c in cls.items() if c == 0 and b in pre]
    grads = [b for b, c in cls.items() if c == 0 and b not in pre]
    saved = [b for b, c in cls.items() if c == 1]
    assert len(state) >= 2 * 16                  # AdamW's exp_avg and exp_avg_sq per parameter
    assert len(grads) >= 16 and all(bwd <= made[b] < opt for b in grads)
    assert saved and all(made[b] < bwd for b in saved)
    params = pre - set(state)
    assert len(params) >= 16 and not params & set(cls)   # parameters are in the rest


@pytest.mark.parametrize("run", ["137", "149", "160"])
def test_recorded_h100_traces_replay_as_recorded(run):
    """The recorded traces replay to the numbers recorded with them and to the later replays with
    the free-order policies and the framework-classes policy (records/victim_trace.jsonl, one
    record per replay): the simulation is deterministic."""
    replayed = _replays(run)
    for model in ("llama", "vit-l", "resnet50"):
        with gzip.open(TRACES / f"trace-{model}.json.gz", "rt") as f:
            tr = json.load(f)
        want = replayed[model]
        assert vt.peak_live_bytes(tr) == want["peak_live"]
        for row in want["rows"]:
            got = vt.simulate(tr, row["capacity"], row["policy"])
            assert (got["bytes_out"], got["bytes_in"]) == (row["bytes_out"], row["bytes_in"]), row
