"""CPU tests of how activation swapping follows the loops people run: a forward saved again
inside backward (reentrant checkpointing), a forward dropped without backward (an
evaluation pass with autograd on), and a forecast kept per shape of step.

They prove the bookkeeping, not survival or speed: the same loops run on the GPU in
tests/conformance/lms_swap/test_lms_swap_loops_gpu.py and in the training-loops benchmark.
"""
from __future__ import annotations

import pathlib

import pytest
import torch

nn = torch.nn
MiB = 1 << 20
LMS_SWAP_SRC = pathlib.Path(__file__).resolve().parent.parent / "lms-swap" / "src"


def _counting_swapper(m):
    sw = m.ActivationSwapper(device_type="cpu", policy="always", size_threshold=4096,
                             host_limit=256 * MiB, host_min_available=0)
    calls = {"fwd": 0, "bwd": 0}
    begin_fwd, begin_bwd = sw._begin_forward, sw._begin_backward

    def fwd():
        calls["fwd"] += 1
        begin_fwd()

    def bwd():
        calls["bwd"] += 1
        begin_bwd()
    sw._begin_forward, sw._begin_backward = fwd, bwd
    return sw, calls


def test_recomputation_in_backward_is_no_new_forward(m):
    """Reentrant checkpointing saves the recomputed segment's tensors inside backward,
    through the same hooks: one forward and one backward per step all the same, and
    gradients as stock's."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(4))
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def step(ctx):
        for p in blocks.parameters():
            p.grad = None
        with ctx:
            h = x * 1.0
            for b in blocks:
                h = checkpoint(b, h, use_reentrant=True)
            h.square().sum().backward()  # hooks on in backward too, as enable() has them
        return [p.grad.clone() for p in blocks.parameters()]

    ref = step(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    sw, calls = _counting_swapper(m)
    for _ in range(3):
        got = step(sw)
        assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert calls == {"fwd": 3, "bwd": 3}, calls
    assert sw.stats()["swap.backward_saves"] > 0


def test_a_forward_dropped_without_backward_ends_there(m):
    """An evaluation pass with autograd on saves tensors and is never differentiated:
    the next training step's forward is a forward of its own."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(64, 256)
    sw, calls = _counting_swapper(m)
    with sw:
        net(x).sum()             # evaluation with autograd on: the graph is dropped
    with sw:
        loss = net(x).sum()
    loss.backward()
    assert calls == {"fwd": 2, "bwd": 1}, calls
    assert sw.stats()["swap.forwards_abandoned"] == 1


@pytest.mark.parametrize("policy", ["auto", "always", "never"])
@pytest.mark.parametrize("size", [64, 1024])
def test_a_dropped_graph_is_freed_whatever_the_hooks_kept(m, policy, size):
    """Tanh saves its own output.  A pack hook that returns that tensor as it is makes
    the node own a tensor that owns the node, a cycle through C++ that no garbage
    collection breaks: a graph dropped without backward then stayed for good (on the
    H100, 13 GiB per evaluation pass of a Llama).  Whatever the swapper keeps, swaps or
    leaves alone, the graph and its tensors go when the last reference does."""
    import gc
    import weakref
    torch.manual_seed(0)
    lin = nn.Linear(size, size)
    x = torch.randn(64, size)
    sw = m.ActivationSwapper(device_type="cpu", policy=policy, size_threshold=4096,
                             host_limit=256 * MiB, host_min_available=0)
    with sw:
        h = torch.tanh(lin(x))
        loss = torch.tanh(lin(h)).sum()
    kept = weakref.ref(h)
    del h, loss
    gc.collect()
    assert kept() is None


def test_a_dropped_forward_that_swapped_nothing_ends_there(m):
    """Under the default policy with room to spare nothing is swapped, and the next
    forward must still be told from the continuation of one dropped without backward."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(64, 256)
    sw = m.ActivationSwapper(device_type="cpu", size_threshold=4096,
                             host_limit=256 * MiB, host_min_available=0)
    calls = {"fwd": 0}
    begin = sw._begin_forward

    def fwd():
        calls["fwd"] += 1
        begin()
    sw._begin_forward = fwd
    for _ in range(2):
        with sw:
            net(x).sum()         # evaluation with autograd on: the graph is dropped
        with sw:
            loss = net(x).sum()
        loss.backward()
    st = sw.stats()
    assert st["swap.out_count"] == 0, st
    assert calls["fwd"] == 4 and st["swap.forwards_abandoned"] == 2, (calls, st)


def test_a_process_that_swapped_exits(m, tmp_path):
    """The pool gives its buffers back from a thread of its own; a pool dropped while the
    interpreter shuts down (no thread can start then; Thread.start waited for ever)
    must not hang the exit."""
    import subprocess
    import sys
    script = tmp_path / "swap_and_exit.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(LMS_SWAP_SRC)!r})\n"
        "import lms_swap as lms\n"
        "sw = lms.ActivationSwapper(device_type='cpu', policy='always', size_threshold=4096,\n"
        "                           host_limit=1 << 28, host_min_available=0)\n"
        "x = torch.randn(256, 256, requires_grad=True)\n"
        "with sw:\n"
        "    loss = torch.tanh(x @ x).sum()\n"
        "loss.backward()\n"
        "import gc\n"
        "gc.disable()\n"
        "sw.cycle = [sw]  # collected only by the last collection, at exit\n"
        "del sw\n"
        "print('done', flush=True)\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "done" in p.stdout, p.stderr[-2000:]


def test_a_forward_whose_branch_is_dropped_goes_on(m):
    """A branch of forward dropped half way (a tensor computed and not used) does not
    end the forward: only a forward whose every handle is gone does."""
    net = nn.Sequential(nn.Linear(256, 256), nn.Tanh())
    x = torch.randn(64, 256)
    sw, calls = _counting_swapper(m)
    with sw:
        h = net(x)
        net(h).sum()             # a side branch, dropped
        loss = net(h).sum()
    loss.backward()
    assert calls == {"fwd": 1, "bwd": 1}, calls


class _St:
    """The fields of a device state that ShapeProfiles reads and writes."""

    def __init__(self, **kw):
        self.sig = None
        self.plan, self.prev_saved, self.largest, self.k = 0, None, 0, None
        self.prev_off, self.prev_growth = [], []
        self.taught_base = None
        for k, v in kw.items():
            setattr(self, k, v)


def test_profiles_keep_each_shape_and_scale_a_new_one(m):
    from lms_swap.profiles import ShapeProfiles, signature
    prof = ShapeProfiles()
    long_, short, mid = (signature(torch.empty(8, 2048, dtype=torch.long)),
                         signature(torch.empty(8, 1024, dtype=torch.long)),
                         signature(torch.empty(8, 1536, dtype=torch.long)))
    st = _St()
    assert prof.enter(st, long_) is None          # nothing learned yet: left as it is
    st.plan, st.prev_saved, st.largest, st.k = 8 << 30, 40 << 30, 1 << 30, 3.0
    st.prev_off, st.prev_growth = [1 << 30, 2 << 30], [30 << 30, 20 << 30]
    assert prof.enter(st, short) == "scaled"      # half the tokens: half the bytes,
    assert (st.prev_saved, st.largest, st.k) == (20 << 30, 512 << 20, 3.0)
    assert st.plan == 0                           # and 20 GiB fewer saved than 8 swapped
    assert st.prev_off == [512 << 20, 1 << 30] and st.prev_growth == [15 << 30, 10 << 30]
    st.plan = 1 << 30                             # what the short step itself taught
    assert prof.enter(st, long_) == "exact"       # the long step's own lessons, unscaled
    assert (st.plan, st.prev_saved, st.k) == (8 << 30, 40 << 30, 3.0)
    assert prof.enter(st, short) == "exact" and st.plan == 1 << 30
    st.plan = 3 << 30
    assert prof.enter(st, mid) == "scaled"        # from the nearest larger shape: 10 GiB
    assert st.plan == 0 and st.prev_saved == 30 << 30  # fewer saved than the 8 it swapped
    st.prev_saved = 30 << 30                      # the mid step swapped 3 of its 30 GiB
    longer = signature(torch.empty(8, 2560, dtype=torch.long))
    prof.enter(st, long_)
    st.plan = 12 << 30                            # the long step now swaps 12 of 40 GiB
    assert prof.enter(st, longer) == "scaled"     # none larger: from the largest below,
    assert st.plan == 22 << 30                    # plus the 10 GiB more it saves
    assert (prof.exact, prof.scaled) == (3, 3)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_chunked_cross_entropy_matches_stock(m, reduction, monkeypatch):
    """The loss in blocks of rows: stock's values and gradients up to rounding, ignored
    targets included (blocks of 7 rows here, so that several blocks and a short last
    one run)."""
    from lms_swap import chunked_loss
    monkeypatch.setattr(chunked_loss, "BLOCK_BYTES", 7 * 4 * 50)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(61, 50, generator=g) * 4
    t = torch.randint(0, 50, (61,), generator=g)
    t[::5] = -100
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(a, t, reduction=reduction)
    got = chunked_loss.cross_entropy(b, t, -100, reduction)
    (ref * 3).backward()
    (got * 3).backward()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7)
    assert torch.all(b.grad[::5] == 0)


def test_the_swapper_chunks_the_loss_only_where_told(m):
    """``chunked_loss=True`` sends a supported F.cross_entropy through the blocks while
    the swapper is entered, and F.cross_entropy is stock's again after; unsupported calls
    (label smoothing, no gradient) and ``"auto"`` on a CPU tensor never are."""
    import torch.nn.functional as F
    from lms_swap import chunked_loss
    stock = F.cross_entropy
    x = torch.randn(chunked_loss.MIN_BYTES // (4 * 4096), 4096, requires_grad=True)
    t = torch.randint(0, 4096, (x.shape[0],))
    sw = m.ActivationSwapper(device_type="cpu", policy="always", host_limit=4 << 30,
                             host_min_available=0, chunked_loss=True)
    with sw:
        assert F.cross_entropy is not stock
        F.cross_entropy(x, t)
        F.cross_entropy(x, t, label_smoothing=0.1)
        with torch.no_grad():
            F.cross_entropy(x, t)
    assert F.cross_entropy is stock
    assert sw.stats()["swap.chunked_losses"] == 1
    auto = m.ActivationSwapper(device_type="cpu", policy="always", host_limit=4 << 30,
                               host_min_available=0)
    with auto:
        F.cross_entropy(x, t)
    assert auto.stats().get("swap.chunked_losses", 0) == 0
    with pytest.raises(ValueError, match="chunked_loss"):
        m.ActivationSwapper(chunked_loss="sometimes")


def test_a_step_that_begins_above_its_lesson_swaps_the_difference_too(m):
    """What is on the device before a step saves anything is not its shape's: gradients
    left by the last optimizer step while an evaluation pass with autograd on runs
    (3 GiB here) are swapped around on top of the plan that shape's training step
    taught; a dropped forward teaches no base, and a step at the lesson's base swaps
    only the plan."""
    from lms_swap.forecast import StepForecast
    from lms_swap.state import DevState
    sw = m.ActivationSwapper(device_type="cpu", policy="auto")
    st = DevState(0)
    level = {"now": 10 << 30}
    forecast = StepForecast(sw.config, guard=lambda: None,
                            allocated_of=lambda _st: level["now"])
    tokens = torch.empty(8, 2048, dtype=torch.long)
    forecast.enter_profile(st, tokens)         # the first step: nothing learned yet
    st.plan, st.taught_base = 4 << 30, st.step_base  # what its backward taught
    level["now"] = 13 << 30                    # an evaluation pass, gradients alive
    forecast.enter_profile(st, tokens)
    assert (st.plan, st.base_extra) == (4 << 30, 3 << 30)
    assert forecast.counts["plan_base_raises"] == 1
    level["now"] = 10 << 30                    # the next training step
    forecast.enter_profile(st, tokens)
    assert (st.plan, st.base_extra, st.taught_base) == (4 << 30, 0, 10 << 30)


def _loss_through_the_swapper(m, monkeypatch, policy, retain):
    """F.cross_entropy over a non-leaf input, chunked, with every tensor swapped
    (``policy="always"``) or none (``"never"``): the input's gradient after one backward,
    or two with ``retain_graph``, and what the chunked backward found handed over."""
    import torch.nn.functional as F
    from lms_swap import chunked_loss, loss_chunking, swapper
    monkeypatch.setattr(chunked_loss, "MIN_BYTES", 4096)
    monkeypatch.setattr(loss_chunking, "MIN_BYTES", 4096)
    monkeypatch.setattr(swapper, "MIN_BYTES", 4096)
    monkeypatch.setattr(chunked_loss, "BLOCK_BYTES", 7 * 4 * 500)
    taken = []
    real = chunked_loss._taken
    monkeypatch.setattr(chunked_loss, "_taken", lambda x: taken.append(real(x)) or taken[-1])
    g = torch.Generator().manual_seed(1)
    x0 = (torch.randn(61, 500, generator=g) * 4).requires_grad_()
    t = torch.randint(0, 500, (61,), generator=g)
    t[::5] = -100
    sw = m.ActivationSwapper(device_type="cpu", policy=policy, size_threshold=1024,
                             host_limit=64 * MiB, host_min_available=0, chunked_loss=True)
    with sw:
        loss = F.cross_entropy(x0 * 1.0, t)
    for _ in range(2 if retain else 1):
        loss.backward(retain_graph=retain)
    ref0 = x0.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref0 * 1.0, t)
    for _ in range(2 if retain else 1):
        ref.backward(retain_graph=retain)
    assert sw.stats()["swap.chunked_losses"] == 1
    return x0.grad, ref0.grad, taken


def test_the_chunked_loss_writes_its_gradient_over_an_input_fetched_back(m, monkeypatch):
    """A swapped input comes back from host memory as a tensor only the loss's backward
    holds: the gradient goes over it (no second tensor of the logits' size), with
    stock's values up to rounding."""
    got, ref, taken = _loss_through_the_swapper(m, monkeypatch, "always", retain=False)
    assert taken == [True]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("policy", ["always", "never"])
def test_a_retained_graph_gives_the_same_gradient_twice(m, monkeypatch, policy):
    """With ``retain_graph`` a second backward reads the saved input again: a swapped one
    is fetched anew from host memory (the first gradient went over the first copy), a
    kept one is never written over."""
    got, ref, taken = _loss_through_the_swapper(m, monkeypatch, policy, retain=True)
    assert taken == ([True, True] if policy == "always" else [False, False])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)


def test_out_of_memory_inside_a_compiled_graph_says_what_to_do(m):
    """An out-of-memory error raised by code torch.compile generated, under the swapper,
    says that swapping cannot act inside one graph and what to do (compile smaller
    pieces, or the allocator's LMS); other errors pass unchanged.  (The generated code's
    frame is stood in for by a function compiled under an inductor file name; the GPU
    test runs a real compiled ResNet-50.)"""
    ns = {"torch": torch}
    exec(compile("def graph():\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried')\n",
                 "/tmp/torchinductor_root/ab/cab.py", "exec"), ns)
    sw = m.ActivationSwapper(device_type="cpu")
    with pytest.raises(torch.OutOfMemoryError, match=r"inside a torch.compile'd graph.*"
                       r"block.compile\(\).*CUDA out of memory. Tried") as e:
        with sw:
            ns["graph"]()
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    with pytest.raises(torch.OutOfMemoryError, match=r"^plain$"):
        with sw:
            raise torch.OutOfMemoryError("plain")
