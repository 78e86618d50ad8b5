"""The victim-policy replay (examples/pytorch/benchmarks/victim_trace.py) on CPU: a real training
step of a small model traced at the dispatcher, then replayed under each policy."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "pytorch" / "benchmarks"))
import victim_trace as vt  # noqa: E402

RESULTS = REPO / "examples" / "pytorch" / "benchmarks" / "results" / "h100-run137"


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
                            for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(128, 256)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    step()                                   # optimizer state exists before the traced step
    return vt.record_step(step, device_type="cpu")


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


@pytest.mark.parametrize("replayed", [RESULTS, RESULTS.parent / "h100-run149"])
def test_recorded_h100_traces_replay_as_recorded(replayed):
    """The traces of run 137 replay to the numbers recorded with them (run 137's README) and to
    the later replay with the free-order policies (run 149's README): the simulation is
    deterministic."""
    for model in ("llama", "vit-l", "resnet50"):
        with gzip.open(RESULTS / f"trace-{model}.json.gz", "rt") as f:
            tr = json.load(f)
        want = json.loads((replayed / f"simulate-{model}.json").read_text())
        assert vt.peak_live_bytes(tr) == want["peak_live"]
        for row in want["rows"]:
            got = vt.simulate(tr, row["capacity"], row["policy"])
            assert (got["bytes_out"], got["bytes_in"]) == (row["bytes_out"], row["bytes_in"]), row
