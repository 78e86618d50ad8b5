"""CPU tests of lms_swap's edges: the eviction net's host budget at arm time, in-place
changes of a saved tensor whose Python object is gone, unusual tensors, and settings
checked when they are given.  (GPU sides: tests/conformance/lms_swap/test_lms_swap_net_hazards.py.)
"""
from __future__ import annotations

import contextlib
import gc
import math

import pytest

import torch  # a test dependency (pyproject.toml): missing, the module fails, it does not skip

MiB = 1 << 20


def cpu_swapper(m, **kw):
    kw.setdefault("policy", "always")
    kw.setdefault("size_threshold", 0)
    kw.setdefault("host_limit", 256 * MiB)
    kw.setdefault("host_min_available", 0)
    return m.ActivationSwapper(device_type="cpu", **kw)


# ------------------------------------------------------------ 1. host budget at arm
class _RecordingNet:
    """Stands in for the compiled net: records the calls the swapper makes to it."""

    def __init__(self):
        self.calls = []
        self._armed = False

    def armed(self):
        return self._armed

    def arm(self, on):
        self.calls.append(("arm", on))
        self._armed = on

    def set_host_budget(self, limit, other, min_available):
        self.calls.append(("set_host_budget", limit, other, min_available))

    def evicted_bytes(self):
        return 0


@pytest.mark.parametrize("source", ["keyword", "env", "default"])
def test_the_net_has_its_host_budget_before_it_is_armed(m, monkeypatch, source):
    """The net must never run without a host limit: the budget is given before arm(True),
    long before the pinned pool exists (a first step may need the net before it swaps)."""
    net = _RecordingNet()
    monkeypatch.setattr(m.guard, "_guard_state", {})
    monkeypatch.setattr(m.guard, "allocator_refusal", lambda: None)
    monkeypatch.setattr(m.swapper, "load_guard", lambda *a, **k: net)
    monkeypatch.setattr(m.swapper, "loaded_guard", lambda: net)
    monkeypatch.setattr(m.guard, "loaded_guard", lambda: net)
    monkeypatch.delenv(m.ENV_HOST_LIMIT, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    kw = {"host_min_available": 3 * MiB}
    if source == "keyword":
        kw["host_limit"] = 123 * MiB
        want = 123 * MiB
    elif source == "env":
        monkeypatch.setenv(m.ENV_HOST_LIMIT, "456")
        want = 456 * MiB
    else:
        want = int(m.host_total() * 0.80) // 8
    sw = m.ActivationSwapper(**kw)  # device_type cuda: the net is asked for
    assert sw._guard() is net
    assert sw._pool is None  # nothing swapped yet
    assert ("arm", True) in net.calls, net.calls
    budgets = [c for c in net.calls[:net.calls.index(("arm", True))] if c[0] == "set_host_budget"]
    assert budgets and budgets[-1] == ("set_host_budget", want, 0, 3 * MiB), net.calls


# ------------------------------------------------------------ 2. other allocators
class _RefusingNet(_RecordingNet):
    def arm(self, on):
        self.calls.append(("arm", on))
        raise RuntimeError("LMS guard: the CUDA allocator is 'pluggable', not the native one")


@pytest.mark.parametrize("how", ["backend", "net_refuses"])
def test_the_net_stays_off_under_another_allocator_with_one_warning(m, monkeypatch, how):
    """Under a pluggable allocator (or any backend but the native caching allocator) the
    net is never armed: one warning, then swapping without it; never a second attempt."""
    monkeypatch.setattr(m.guard, "_guard_state", {})
    net = _RefusingNet() if how == "net_refuses" else _RecordingNet()
    if how == "backend":
        monkeypatch.setattr(m.torch.cuda, "get_allocator_backend", lambda: "pluggable")
    else:
        monkeypatch.setattr(m.guard, "allocator_refusal", lambda: None)
    monkeypatch.setattr(m.swapper, "load_guard", lambda *a, **k: net)
    monkeypatch.setattr(m.swapper, "loaded_guard", lambda: net)
    sw = m.ActivationSwapper(host_limit=64 * MiB, host_min_available=0)
    with pytest.warns(RuntimeWarning, match="eviction net off.*pluggable"):
        assert sw._guard() is None
    arms = len([c for c in net.calls if c[0] == "arm"])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sw._guard() is None and sw._guard() is None  # no second warning
    assert len([c for c in net.calls if c[0] == "arm"]) == arms <= 1
    assert not net.armed()


def test_a_pluggable_allocators_own_counts_replace_the_drivers(m):
    """Under a pluggable allocator that counts (lms_swap.allocator installs its counts), the
    swapper reads those, not the driver's in-use bytes, which count that allocator's cache as
    in use; with the counts taken away, the driver's view again."""
    dm = m.device_memory
    seen = []

    def counts(index):
        seen.append(index)
        return (3 * MiB, 8 * MiB, 5 * MiB)

    dm.use_counters(counts)
    try:
        assert (dm.allocated(0), dm.reserved(0), dm.peak_allocated(0)) == (3 * MiB, 8 * MiB, 5 * MiB)
        assert dm.counted_by_allocator(0) and seen == [0, 0, 0]
    finally:
        dm.use_counters(None)
    assert dm._counters is None


# ------------------------------------------------------------ 4. in place after saving
def _inplace_on_base_after_the_view_is_gone(ctx):
    """Saves a dense view of ``base`` (its Python object then dropped), changes ``base``
    in place, runs backward."""
    torch.manual_seed(0)
    w = torch.randn(4096, requires_grad=True)
    base = torch.randn(8192)
    with ctx():
        v = base[:4096]        # a view: shares base's version counter
        out = (v * w).sum()    # mul saves v (for w's gradient)
        del v
    base.add_(1.0)             # in place on the base: the saved view changed
    out.backward()
    return w.grad


def _inplace_on_output_after_it_is_gone(ctx):
    torch.manual_seed(0)
    a = torch.randn(64, 64, requires_grad=True)
    with ctx():
        b = a * 2
        c = b.exp()            # saves its result
        alias = c.view(-1)     # shares c's version counter
        del c
        loss = alias.sum()
    alias.mul_(2)              # changes what exp saved
    loss.backward()
    return a.grad


@pytest.mark.parametrize("case", [_inplace_on_base_after_the_view_is_gone,
                                  _inplace_on_output_after_it_is_gone])
def test_inplace_change_after_the_object_is_gone_raises_as_stock(m, case):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        case(contextlib.nullcontext)                 # stock
    sw = cpu_swapper(m)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        case(lambda: sw)                             # swapped
    assert sw.stats()["swap.out_count"] >= 1


def test_version_check_keeps_no_storage_alive(m):
    """What the check keeps of a saved tensor holds none of its memory."""
    sw = cpu_swapper(m)
    a = torch.randn(1024, 1024, requires_grad=True)
    with sw:
        b = a * 2
        out = b.sin().sum()
    st = b.untyped_storage()
    before = st._cdata
    del b
    gc.collect()
    # the storage of b lives on only through autograd's saved tensor, which was swapped:
    # the handle's version alias must not hold it
    h = [x for x in gc.get_objects() if isinstance(x, m.state.Swapped)]
    assert h
    for x in h:
        alias = x.version_of
        assert alias.untyped_storage().nbytes() == 0
    del st, before
    out.backward()


# ------------------------------------------------------------ 5. unusual tensors
def _roundtrip(m, make, fn):
    """Runs fn on make() with and without swapping; returns (stock, swapped) outputs and
    gradients."""
    res = []
    for ctx in (contextlib.nullcontext, lambda: cpu_swapper(m)):
        torch.manual_seed(0)
        x = make()
        with ctx():
            y = fn(x)
        y.backward()
        res.append((y.detach(), x.grad))
    return res


def _same(u, v):
    if u.is_complex():
        return torch.equal(torch.view_as_real(u.resolve_conj()), torch.view_as_real(v.resolve_conj()))
    return torch.equal(u, v)


CASES = {
    "complex": (lambda: torch.randn(64, 64, dtype=torch.complex64, requires_grad=True),
                lambda x: (x * 1.5).exp().abs().sum()),
    "conj_view": (lambda: torch.randn(64, 64, dtype=torch.complex64, requires_grad=True),
                  lambda x: ((x * 1.5).conj() * x).exp().real.sum()),
    "conj_physical_input": (lambda: torch.randn(64, 64, dtype=torch.complex64, requires_grad=True),
                            lambda x: torch.sin((x * 2).conj()).abs().sum()),
    "neg_view": (lambda: torch.randn(64, 64, dtype=torch.complex64, requires_grad=True),
                 lambda x: (torch._neg_view((x * 1.5).conj()) * x).exp().real.sum()),
    "neg_view_real": (lambda: torch.randn(64, 64, requires_grad=True),
                      lambda x: (torch._neg_view(x * 1.5) * x).exp().sum()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unusual_dense_tensors_round_trip_bitwise(m, name):
    make, fn = CASES[name]
    (y0, g0), (y1, g1) = _roundtrip(m, make, fn)
    assert _same(y0, y1) and _same(g0, g1)


def test_conj_and_neg_views_are_restored_with_their_bits(m):
    """A saved conjugate or negative view comes back as what was saved, not as the bytes
    under it."""
    sw = cpu_swapper(m)
    z = torch.randn(32, 32, dtype=torch.complex64)
    for view in (z.conj(), torch._neg_view(z), torch._neg_view(z.conj())):
        packed = sw._pack(view)
        back = sw._unpack(packed)
        assert back.is_conj() == view.is_conj() and back.is_neg() == view.is_neg()
        assert torch.equal(torch.view_as_real(back.resolve_conj().resolve_neg()),
                           torch.view_as_real(view.resolve_conj().resolve_neg()))


def test_nested_sparse_and_quantized_tensors_never_raise_from_forward(m):
    sw = cpu_swapper(m)
    nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)])
    sp = torch.randn(16, 16).relu().to_sparse()
    csr = torch.randn(16, 16).relu().to_sparse_csr()
    q = torch.quantize_per_tensor(torch.randn(64, 64), 0.1, 0, torch.quint8)
    for t in (nt, sp, csr, q, torch.randn(8, device="meta")):
        packed = sw._pack(t)       # kept on the device (here: as it is)
        assert sw._unpack(packed) is t
    # and through autograd: a nested tensor's forward and backward
    for ctx in (contextlib.nullcontext, lambda: sw):
        a = torch.randn(3, 8, requires_grad=True)
        b = torch.randn(5, 8, requires_grad=True)
        with ctx():
            n = torch.nested.as_nested_tensor([a * 2, b * 2])
            y = (n * n).sin()
            loss = sum(t.sum() for t in y.unbind())
        loss.backward()
    q_in = torch.randn(4, 4, requires_grad=True)
    with sw:
        y = (torch.dequantize(torch.quantize_per_tensor(q_in.detach(), 0.1, 0, torch.quint8)) * q_in).sum()
    y.backward()


# ------------------------------------------------------------ 6. settings
BAD_ENV = ["abc", "nan", "inf", "-inf", "-5", "1e400", " "]


@pytest.mark.parametrize("value", [v for v in BAD_ENV if v.strip()])
def test_bad_host_limit_env_fails_at_enable_and_configure(m, monkeypatch, value):
    monkeypatch.setenv(m.ENV_HOST_LIMIT, value)
    for call in (lambda: m.ActivationSwapper(device_type="cpu"),
                 lambda: m.SwapConfig(),
                 lambda: m.host_mem_limit_from_env()):
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert m.ENV_HOST_LIMIT in msg and repr(value) in msg and "MiB" in msg, msg
    monkeypatch.delenv(m.ENV_HOST_LIMIT)
    sw = m.ActivationSwapper(device_type="cpu")
    monkeypatch.setenv(m.ENV_HOST_LIMIT, value)
    with pytest.raises(ValueError, match=m.ENV_HOST_LIMIT):
        sw.configure(prefetch_depth=2)


def test_bad_settings_fail_at_enable_not_at_the_first_swap(m, monkeypatch):
    monkeypatch.setattr(m, "_default", None)
    monkeypatch.setenv(m.ENV_HOST_LIMIT, "abc")
    with pytest.raises(ValueError, match=m.ENV_HOST_LIMIT):
        m.enable(device_type="cpu")
    assert not m.is_enabled()
    monkeypatch.setenv(m.ENV_HOST_LIMIT, "64")
    m.enable(device_type="cpu")
    try:
        monkeypatch.setenv(m.ENV_HOST_LIMIT, "nan")
        with pytest.raises(ValueError, match=m.ENV_HOST_LIMIT):
            m.enable()                   # already enabled: checked again all the same
        with pytest.raises(ValueError, match=m.ENV_HOST_LIMIT):
            with m.swapping():
                pass
    finally:
        m.disable()


def test_zero_host_limit_means_no_swap_space(m, monkeypatch):
    monkeypatch.setenv(m.ENV_HOST_LIMIT, "0")
    assert m.host_mem_limit_from_env() == 0
    assert m.ActivationSwapper(device_type="cpu")._host_limits()[0] == 0


def test_the_nets_host_full_error_reaches_the_program_as_lms_host_memory_error(m):
    """The net's out-of-memory error where its host swap space was full is the error of a
    host limit reached (LMSHostMemoryError, still a torch.OutOfMemoryError) when it leaves
    the swapped region; its message is kept.  Another out-of-memory error stays as it is.
    The words the swapper looks for are the net's own (its C++ source says them)."""
    source = ""
    for path in (m.guard.GUARD_SOURCE, *m.guard.GUARD_HEADERS):
        with open(path) as f:
            source += f.read()
    assert m.guard.HOST_FULL_WORDS in source
    net_msg = ("CUDA out of memory. Tried to allocate 2.00 GiB.\nLMS activation swapping could "
               "not make room for this request of 2.00 GiB: " + m.guard.HOST_FULL_WORDS +
               " (PYTORCH_LMS_HOST_MEM_LIMIT_IN_MB or host_limit sets it).")
    with pytest.raises(m.LMSHostMemoryError) as ei:
        with cpu_swapper(m):
            raise torch.OutOfMemoryError(net_msg)
    assert net_msg in str(ei.value) and isinstance(ei.value, torch.OutOfMemoryError)
    with pytest.raises(torch.OutOfMemoryError) as ei:
        with cpu_swapper(m):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert not isinstance(ei.value, m.LMSHostMemoryError)


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-5", "-1e-3"])
def test_bad_threshold_env_names_its_variable(m, monkeypatch, value):
    monkeypatch.setenv(m.ENV_THRESHOLD, value)
    with pytest.raises(ValueError) as e:
        m.SwapConfig()
    msg = str(e.value)
    assert m.ENV_THRESHOLD in msg and repr(value) in msg and "KiB" in msg, msg


BAD_KW = [
    ("policy", "sometimes"), ("policy", None),
    ("size_threshold", -1), ("size_threshold", "abc"), ("size_threshold", math.nan),
    ("size_threshold", math.inf),
    ("device_limit", 0), ("device_limit", -5), ("device_limit", math.nan), ("device_limit", "big"),
    ("device_limit_fraction", 0), ("device_limit_fraction", 1.5), ("device_limit_fraction", math.nan),
    ("margin", -1), ("margin", math.nan), ("margin", "x"),
    ("margin_factor", -1), ("margin_factor", math.nan), ("margin_factor", math.inf),
    ("adaptive_margin", "yes"), ("adaptive_margin", 2),
    ("min_margin", -1), ("min_margin", math.nan),
    ("min_margin_factor", -0.5), ("min_margin_factor", math.nan),
    ("first_margin_fraction", 1.0), ("first_margin_fraction", -0.1), ("first_margin_fraction", math.nan),
    ("prefetch_reserve_factor", -1), ("prefetch_reserve_factor", math.nan),
    ("prefetch_depth", -1), ("prefetch_depth", 2.5), ("prefetch_depth", "4"), ("prefetch_depth", True),
    ("max_inflight_bytes", 0), ("max_inflight_bytes", math.nan),
    ("query_every", 0), ("query_every", 1.5),
    ("plan", "no"), ("plan", None),
    ("host_limit", -5), ("host_limit", math.nan), ("host_limit", math.inf), ("host_limit", "abc"),
    ("host_min_available", -1), ("host_min_available", math.nan),
    ("dedupe", "true"), ("trace", 1.0), ("guard", "off"),
    ("min_storage_fraction", -0.1), ("min_storage_fraction", 1.5), ("min_storage_fraction", math.nan),
    ("device_type", "xpu"),
]


@pytest.mark.parametrize("key,value", BAD_KW, ids=[f"{k}={v!r}" for k, v in BAD_KW])
def test_every_keyword_is_checked_with_an_error_that_names_it(m, monkeypatch, key, value):
    monkeypatch.setattr(m, "_default", None)
    calls = [lambda: m.SwapConfig(**{key: value}),
             lambda: m.ActivationSwapper(device_type="cpu").configure(**{key: value}),
             lambda: m.configure(**{key: value})]
    for call in calls:
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert key in msg and repr(value) in msg and ("accepted" in msg or "must be" in msg), msg
    sw = m.ActivationSwapper(device_type="cpu", policy="always")
    before = sw.config.as_dict()
    with pytest.raises(ValueError):
        sw.configure(**{key: value})
    assert sw.config.as_dict() == before  # a refused setting changes nothing


GOOD_KW = [("size_threshold", 0), ("size_threshold", 2.0 * MiB), ("device_limit", None),
           ("device_limit_fraction", 1.0), ("margin", 0), ("min_margin_factor", None),
           ("first_margin_fraction", 0.0), ("prefetch_depth", 0), ("host_limit", 0),
           ("adaptive_margin", False), ("guard", False), ("min_storage_fraction", 0.0)]


@pytest.mark.parametrize("key,value", GOOD_KW, ids=[f"{k}={v!r}" for k, v in GOOD_KW])
def test_accepted_settings_stay_accepted(m, key, value):
    assert getattr(m.SwapConfig(**{key: value}), key) == value
