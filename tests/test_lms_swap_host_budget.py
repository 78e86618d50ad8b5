"""The host budget's default as lms_swap applies it: which copy of the rule is in force (the
patched allocator's C++ rule where torch.cuda.lms has it, lms_swap's own copy on stock torch), and
that lms_swap's copy keeps its stock-torch behaviour.  That the two copies agree on the same inputs
is checked against the real built libc10_cuda in tests/test_pytorch_allocator_build.py
(test_host_budget_rule_agrees_with_lms_swaps_copy)."""
from __future__ import annotations

import types

import pytest

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def env(m):
    return m.environment


def test_stock_torch_uses_lms_swaps_copy(m, env, monkeypatch):
    monkeypatch.setattr(env, "allocator_lms", lambda: None)
    monkeypatch.delenv(m.ENV_HOST_LIMIT, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert m.host_budget_source() == env.HOST_BUDGET_LMS_SWAP
    assert m.host_budget_default(100 * GiB) == int(100 * GiB * 0.80) // 4
    total = m.host_total()
    sw = m.ActivationSwapper(device_type="cpu")
    assert sw._host_limits()[0] == (int(total * 0.80) // 4 if total else 64 * GiB)


@pytest.mark.parametrize("limit_mb,lws,host,want", [
    (None, None, 10 * GiB, int(10 * GiB * 0.8)),
    ("", "8", 10 * GiB, int(10 * GiB * 0.8) // 8),          # blank: unset
    ("  ", "zero", 10 * GiB, int(10 * GiB * 0.8)),          # not a number of processes: one
    ("0", "4", 10 * GiB, 0),                                # 0: no swap space
    ("1.5", None, 0, int(1.5 * MiB)),
    (" 2_048 ", "2", 10 * GiB, 2048 * MiB),                 # the limit is per process
    ("1e3", "-3", 7, 1000 * MiB),
    (None, "+4", 1001, int(1001 * 0.8)),                    # "+4" is not all digits
])
def test_lms_swaps_copy_of_the_rule(env, limit_mb, lws, host, want):
    assert env.host_budget_rule(limit_mb, lws, host) == want


@pytest.mark.parametrize("limit_mb", ["abc", "nan", "inf", "-5", "1e400", "0x10", "1__0", "_1"])
def test_lms_swaps_copy_refuses_what_the_environment_check_refuses(m, env, limit_mb):
    with pytest.raises(ValueError, match=m.ENV_HOST_LIMIT):
        env.host_budget_rule(limit_mb, None, GiB)


def test_patched_build_asks_the_allocators_rule(m, env, monkeypatch):
    """With torch.cuda.lms's _host_budget_rule present and answering, lms_swap's budget is the
    allocator's answer for this process's environment, and host_budget_source says so."""
    calls = []

    def rule(limit_mb, lws, host_bytes):
        calls.append((limit_mb, lws, host_bytes))
        return 12345 if host_bytes else 0

    monkeypatch.setattr(env, "allocator_lms", lambda: types.SimpleNamespace(_host_budget_rule=rule))
    monkeypatch.setenv(m.ENV_HOST_LIMIT, "64")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert m.host_budget_source() == env.HOST_BUDGET_ALLOCATOR
    assert m.host_budget_default(8 * GiB) == 12345
    assert calls[-1] == ("64", "2", 8 * GiB)
    sw = m.ActivationSwapper(device_type="cpu")
    assert sw._host_limits()[0] == 12345
    assert sw.config.host_limit is None


def test_a_patched_torch_whose_library_has_no_rule_falls_back(m, env, monkeypatch):
    """torch.cuda.lms without a libc10_cuda rule (an older build) answers None: lms_swap's copy."""
    monkeypatch.setattr(env, "allocator_lms",
                        lambda: types.SimpleNamespace(_host_budget_rule=lambda *a: None))
    monkeypatch.delenv(m.ENV_HOST_LIMIT, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert m.host_budget_source() == env.HOST_BUDGET_LMS_SWAP
    assert m.host_budget_default(10 * GiB) == int(10 * GiB * 0.8)


def test_the_pluggable_allocators_lms_shares_one_host_budget(m, env, monkeypatch):
    """On stock torch with the pluggable allocator installed (lms_swap.allocator.enable hands
    its LMS over), the swapper's host pool books its pinned chunks against that allocator's
    budget, as on a patched build: one budget for both layers, not two of 80% each.  Taken
    away, stock torch again has none."""
    monkeypatch.delattr(m.torch.cuda, "lms", raising=False)
    booked = []
    lms = types.SimpleNamespace(_host_reserve=lambda n: booked.append(n) or True,
                                _host_release=lambda n: booked.append(-n),
                                get_limit_lms=lambda: 0)
    env.use_allocator_lms(lms)
    try:
        assert env.allocator_lms() is lms
        sw = m.ActivationSwapper(device_type="cpu", host_limit=64 * MiB, host_min_available=0)
        buf = sw.pool.alloc(1 * MiB)
        assert booked and booked[0] >= 1 * MiB, booked
        assert sum(booked) == sw.pool.reserved, (booked, sw.pool.reserved)
        del buf
    finally:
        env.use_allocator_lms(None)
    assert env.allocator_lms() is None
