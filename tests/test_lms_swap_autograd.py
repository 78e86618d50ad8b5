"""CPU tests of LMS activation swapping on real torch autograd: the swapper's pack / unpack /
prefetch / release machinery on CPU tensors (``device_type="cpu"``): bitwise round trips, the
policies, views and in-place changes, checkpointing, errors mid-forward, steps that vary.
"""
from __future__ import annotations

import contextlib
import gc

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip

from tests.lms_swap_cpu import MiB, assert_equal_tensors, cpu_swapper

nn = torch.nn


# ------------------------------------------------------------------ autograd on CPU tensors
def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Flatten(), nn.Linear(8 * 16 * 16, 10),
    ).to(memory_format=torch.channels_last)


def _train(ctx, steps=2, retain=False):
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=g).to(memory_format=torch.channels_last)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        with ctx():
            loss = model(x).square().mean()
        loss.backward(retain_graph=retain)
        if retain:
            loss.backward()
        out.append(loss.detach())
        out += [p.grad.clone() for p in model.parameters()]
        opt.step()
    return out


def test_swap_roundtrip_is_bitwise(m):
    sw = cpu_swapper(m, prefetch_depth=2)
    assert_equal_tensors(_train(contextlib.nullcontext), _train(lambda: sw))
    s = sw.stats()
    assert s["swap.out_count"] > 0 and s["swap.in_bytes"] == s["swap.out_bytes"]
    assert s["swap.dedupe_hits"] >= 2          # ReLU(inplace) outputs saved twice
    assert s["swap.prefetched"] > 0 and s["swap.prefetch_hits"] > 0
    assert s["host.in_use_bytes"] == 0         # everything returned after backward
    assert s["host.pool_hits"] > 0             # second step reuses the buffers


def test_policy_never_and_threshold(m):
    sw = cpu_swapper(m, policy="never")
    assert_equal_tensors(_train(contextlib.nullcontext), _train(lambda: sw))
    assert sw.stats()["swap.out_count"] == 0
    sw = cpu_swapper(m, size_threshold=1 << 40)
    _train(lambda: sw)
    s = sw.stats()
    assert s["swap.out_count"] == 0 and s["swap.small_count"] > 0


def test_auto_policy_swaps_only_past_the_limit(m):
    # CPU mode reads the allocation as 0: a trigger (limit - margin) below 0 means pressure
    sw = cpu_swapper(m, policy="auto", device_limit=1 << 40, margin=0, adaptive_margin=False)
    _train(lambda: sw)
    assert sw.stats()["swap.out_count"] == 0
    sw = cpu_swapper(m, policy="auto", device_limit=1, margin=2, adaptive_margin=False)
    assert_equal_tensors(_train(contextlib.nullcontext), _train(lambda: sw))
    assert sw.stats()["swap.out_count"] > 0


def _pressure_everywhere(m, **kw):
    # CPU mode reads the allocation as 0: limit 1 GiB and margin 1 GiB - 1 make every
    # tensor cross the trigger while the allocation stays under the limit
    return cpu_swapper(m, policy="auto", device_limit=1 << 30, margin=(1 << 30) - 1,
                       adaptive_margin=False, **kw)


def test_tail_is_kept_from_the_second_step(m):
    sw = _pressure_everywhere(m)
    ref = _train(contextlib.nullcontext, steps=1)
    assert_equal_tensors(ref, _train(lambda: sw, steps=1))
    s1 = sw.stats()
    assert s1["swap.tail_kept"] == 0 and s1["swap.kept_count"] == 0  # nothing learned yet
    sw.reset_stats()
    model_steps = _train(lambda: sw, steps=2)   # the swapper knows a forward now
    s2 = sw.stats()
    assert s2["swap.tail_kept"] >= 1 and s2["swap.out_count"] > s2["swap.tail_kept"]
    assert_equal_tensors(_train(contextlib.nullcontext, steps=2), model_steps)


def test_full_swap_space_keeps_tensors_under_the_limit(m):
    sw = _pressure_everywhere(m, host_limit=32 * 1024)
    assert_equal_tensors(_train(contextlib.nullcontext), _train(lambda: sw))
    s = sw.stats()
    assert s["swap.host_full_kept"] > 0 and s["host.reserved_bytes"] <= 32 * 1024
    # with no room on the device either, the host error stands
    sw = cpu_swapper(m, policy="auto", device_limit=1, margin=2, adaptive_margin=False,
                     host_limit=32 * 1024)
    with pytest.raises(m.LMSHostMemoryError, match="host swap space exhausted"):
        _train(lambda: sw)
    gc.collect()
    assert sw.stats()["host.in_use_bytes"] == 0


def test_retain_graph(m):
    sw = cpu_swapper(m)
    assert_equal_tensors(_train(contextlib.nullcontext, retain=True), _train(lambda: sw, retain=True))
    s = sw.stats()
    assert s["swap.in_bytes"] >= 2 * s["swap.out_bytes"] > 0


def test_views_and_inplace_detection(m):
    sw = cpu_swapper(m)

    def run(ctx):
        torch.manual_seed(0)
        a = torch.randn(64, 64, requires_grad=True)
        with ctx():
            b = a * 1.0
            loss = ((b.t() @ b).sin().sum() + (b[:, ::2] ** 2).sum()
                    + (b.unsqueeze(0).expand(3, -1, -1) * b).sum())
        loss.backward()
        return [loss.detach(), a.grad]

    assert_equal_tensors(run(contextlib.nullcontext), run(lambda: sw))
    assert sw.stats()["swap.not_dense_kept"] >= 1

    a = torch.randn(64, 64, requires_grad=True)
    with sw:
        b = a * 2
        c = b.exp()  # saves its result
        c.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()


def test_checkpoint_and_no_grad(m):
    from torch.utils.checkpoint import checkpoint

    sw = cpu_swapper(m)
    lin = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128))

    def run(ctx, reentrant):
        for p in lin.parameters():
            p.grad = None
        x = torch.randn(64, 128, generator=torch.Generator().manual_seed(2), requires_grad=True)
        with ctx():
            y = checkpoint(lin, x, use_reentrant=reentrant).tanh() * x
        y.sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in lin.parameters()]

    for reentrant in (False, True):
        assert_equal_tensors(run(contextlib.nullcontext, reentrant), run(lambda: sw, reentrant))
    before = sw.stats()["swap.out_count"]
    with torch.no_grad(), sw:
        lin(torch.randn(64, 128))
    assert sw.stats()["swap.out_count"] == before


def test_exception_mid_forward_returns_host_memory(m):
    sw = cpu_swapper(m)
    model = _net()
    x = torch.randn(8, 3, 16, 16)
    for _ in range(3):
        with pytest.raises(ZeroDivisionError):
            with sw:
                h = model[:5](x)
                1 / 0
    del h
    gc.collect()
    s = sw.stats()
    assert s["swap.out_count"] > 0 and s["host.in_use_bytes"] == 0
    assert s["host.pool_misses"] < s["swap.out_count"]  # later attempts reused buffers
    assert sw.empty_cache() == s["host.reserved_bytes"]


def test_host_limit_error_during_forward(m):
    sw = cpu_swapper(m, host_limit=32 * 1024)
    with pytest.raises(m.LMSHostMemoryError, match="host swap space exhausted"):
        with sw:
            _net()(torch.randn(8, 3, 16, 16))
    gc.collect()
    assert sw.stats()["host.in_use_bytes"] == 0


def test_module_level_enable_disable(m):
    m.configure(device_type="cpu", policy="always", size_threshold=4096,
                host_limit=256 * MiB, host_min_available=0)
    try:
        ref = _train(contextlib.nullcontext)
        m.reset_stats()
        m.enable()
        m.enable()  # idempotent
        assert m.is_enabled()
        out = _train(contextlib.nullcontext)
        m.disable()
        assert not m.is_enabled()
        assert_equal_tensors(ref, out)
        assert m.stats()["swap.out_count"] > 0
        with m.swapping():
            _train(contextlib.nullcontext, steps=1)
    finally:
        m.disable()
        m.configure(device_type="cuda", policy="auto", size_threshold=MiB,
                    host_limit=None, host_min_available=None)
        m.empty_cache()


def test_trace_records_events(m):
    sw = cpu_swapper(m, trace=True)
    _train(lambda: sw, steps=1)
    events = {e[1] for e in sw.trace()}
    assert {"out", "in"} <= events


def test_eviction_net_without_cuda_warns_and_swapping_goes_on(m, monkeypatch):
    """Where the net cannot be built (here: no CUDA) swapping runs on its forecast alone,
    says so once, and reports the net inactive; ``required=True`` raises instead."""
    monkeypatch.setattr(m.guard, "_guard_state", {})
    monkeypatch.setattr(m.torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="eviction net not built"):
        assert m.load_guard() is None
    assert m.load_guard() is None            # decided once: no second warning, no rebuild
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        m.load_guard(required=True)
    sw = cpu_swapper(m)
    assert sw._guard() is None               # device_type="cpu": never asked for
    assert sw.stats()["guard.active"] == 0


def test_no_net_is_compiled_for_an_allocator_it_could_not_be_armed_under(m, monkeypatch):
    """Under another CUDA allocator (a pluggable one, cudaMallocAsync) the net could never be
    armed: it is not compiled (a fresh machine spent 27 s on it in a first step, then refused
    it), and swapping goes on without it, saying why once."""
    monkeypatch.setattr(m.guard, "_guard_state", {})
    monkeypatch.setattr(m.guard, "unsupported_reason", lambda: None)
    monkeypatch.setattr(m.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(m.torch.cuda, "get_allocator_backend", lambda: "pluggable")

    def no_build():
        raise AssertionError("the net was compiled for an allocator it cannot sit under")
    monkeypatch.setattr(m.guard, "_load_net", no_build)
    with pytest.warns(RuntimeWarning, match="eviction net not built.*'pluggable'"):
        assert m.load_guard() is None
    with pytest.raises(RuntimeError, match="not PyTorch's native caching allocator"):
        m.load_guard(required=True)


def _varied_steps(ctx):
    """Steps that vary as training does: sequence length, an eval pass with and without
    autograd between steps, gradient accumulation over two micro-batches, a short last
    batch.  Returns the losses and the final weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    losses = []
    for seq, micro, batch in ((16, 1, 8), (48, 1, 8), (32, 2, 8), (8, 1, 8), (40, 1, 3)):
        opt.zero_grad(set_to_none=True)
        for _ in range(micro):
            x = torch.randn(batch, seq, 64, generator=g)
            with ctx():
                loss = model(x).pow(2).mean() / micro
            loss.backward()
            losses.append(loss.detach())
        opt.step()
        with torch.no_grad():                  # eval without autograd
            losses.append(model(torch.randn(2, seq, 64, generator=g)).sum())
        with ctx():                            # eval with autograd, no backward
            losses.append(model(torch.randn(2, seq, 64, generator=g)).sum().detach())
    return losses, [p.detach().clone() for p in model.parameters()]


def _varied_steps_swapper(m, policy):
    if policy == "auto":   # limit and margin that put every step past auto's trigger
        return _pressure_everywhere(m, prefetch_depth=2)
    return cpu_swapper(m, policy=policy, prefetch_depth=2)


@pytest.mark.parametrize("policy", ["always", "auto"])
def test_steps_that_vary_train_bitwise_and_return_host_memory(m, policy):
    sw = _varied_steps_swapper(m, policy)
    ref_losses, ref_params = _varied_steps(contextlib.nullcontext)
    losses, params = _varied_steps(lambda: sw)
    s = sw.stats()
    # the bitwise check below compares swapped runs with stock ones only if tensors did
    # go to host memory and come back, in every policy
    assert s["swap.out_count"] > 0 and s["swap.in_count"] > 0, {k: v for k, v in s.items() if k.startswith("swap.")}
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    gc.collect()
    s = sw.stats()
    assert s.get("host.in_use_bytes", 0) == 0  # the eval graphs without backward too
