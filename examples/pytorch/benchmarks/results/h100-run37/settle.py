"""Run 37 diagnostic (not a benchmark): GPT-2 at batch 34 (stock's largest), one line per
step: step time, caching-allocator retries in that step, and a fingerprint of the swap
decisions (which saved tensors went out, and why).

    NSTEPS=32 python3 examples/pytorch/benchmarks/results/h100-run37/settle.py lms|stock|never|freeze|lazy|ec|ec3

lms: this repository's lms_swap; stock: no hooks; never: policy="never"; freeze: from step
5 on, repeat step 4's decisions exactly; lazy: planned tensors keep their device memory
until backward starts (copies still go out at once); ec / ec3: torch.cuda.empty_cache()
before step 5 (and 6, 7).  lazy and freeze patch the swapper's internals: diagnostics only.
"""
import os, sys, pathlib, types, contextlib, time, hashlib, json
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = pathlib.Path(__file__).resolve().parents[5]  # the repository
sys.path.insert(0, str(ROOT / "examples/pytorch/benchmarks")); sys.path.insert(0, str(ROOT / "examples/pytorch"))
import torch, bench_lms_swap as B
from lms_swap_loader import load_lms_swap
variant = sys.argv[1]  # stock | lms | freeze | never
lms = load_lms_swap(prefer_patched=False) if variant != "stock" else None
EC = {"ec": {5}, "ec3": {5, 6, 7}, "ec8": {8}}.get(variant, set())
if variant == "never":
    lms.configure(policy="never")
model, loss_fn, _, _ = B.build("gpt2", 34, types.SimpleNamespace(image_size=448, seq_len=4096, loss_chunk=512))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
log, frozen = [], {"on": False, "rec": None}
if lms is not None:
    sw = lms.get_swapper()
    orig = sw._decide
    def dec(st, t, nbytes):
        r = orig(st, t, nbytes)
        if frozen["on"] and frozen["rec"] is not None and len(log) < len(frozen["rec"]):
            nb, why, wait = frozen["rec"][len(log)]
            if nb == nbytes:
                r = (why, wait) if why is not None else (None, False)
        log.append((nbytes, r[0], r[1]))
        return r
    sw._decide = dec
    if variant == "lazy":
        import weakref as _wr
        M = sys.modules[type(sw).__module__]
        held = []; hb = [0]; last_why = [None]
        o_alloc, o_bb, o_swap = sw._allocated, sw._begin_backward, sw._swap_out
        def alloc_(st):
            return o_alloc(st) - hb[0]
        def bb():
            for t, ev in held:
                ev.synchronize()
            held.clear(); hb[0] = 0
            o_bb()
        def swap_out(st, t, nbytes, wait=True):
            if last_why[0] != "plan":
                return o_swap(st, t, nbytes, wait)
            host = sw.pool.alloc(nbytes)
            h = M._Swapped(); h.owner = sw; h.d2h_event = None; h.nbytes = nbytes
            h.size = t.size(); h.stride = t.stride(); h.dtype = t.dtype; h.device = t.device
            h.host = host; h.gpu = None; h.gpu_stream = None; h.h2d_event = None
            h.refs = 1; h.unpacks = 0; h.pass_id = -1; h.version = t._version; h.orig = _wr.ref(t)
            src = t.as_strided((t.numel(),), (1,), t.storage_offset()).view(torch.uint8)
            cur = torch.cuda.current_stream(t.device)
            st.d2h.wait_stream(cur)
            with torch.cuda.stream(st.d2h):
                host.copy_(src, non_blocking=True)
                ev = torch.cuda.Event(); ev.record(st.d2h)
            h.d2h_event = ev
            held.append((t, ev)); hb[0] += nbytes
            h.index = len(st.order); st.order.append(_wr.ref(h))
            st.swapped_in_fwd += 1; sw.c["out_count"] += 1; sw.c["out_bytes"] += nbytes
            return h
        o_dec = sw._decide
        def dec2(st, t, nbytes):
            r = o_dec(st, t, nbytes); last_why[0] = r[0]; return r
        sw._decide = dec2
        sw._allocated = alloc_; sw._begin_backward = bb; sw._swap_out = swap_out
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with (lms.swapping() if lms else contextlib.nullcontext()):
            loss = loss_fn()
    loss.backward(); opt.step(); torch.cuda.synchronize()
prev = None
r0 = torch.cuda.memory_stats()["num_alloc_retries"]
NSTEPS = int(os.environ.get("NSTEPS", "16")); times = []; rets = []
for i in range(NSTEPS):
    if variant == "freeze" and i == 5:
        frozen["on"] = True
    log.clear()
    if i in EC:
        t0 = time.perf_counter(); torch.cuda.empty_cache(); print("empty_cache", round(time.perf_counter() - t0, 4))
    t0 = time.perf_counter(); step(); dt = time.perf_counter() - t0
    r1 = torch.cuda.memory_stats()["num_alloc_retries"]
    sig = [(nb, w) for nb, w, _ in log]
    outs = [k for k, (nb, w) in enumerate(sig) if w is not None]
    diff = None if prev is None else [k for k in range(min(len(sig), len(prev))) if sig[k] != prev[k]]
    h = hashlib.md5(repr(sig).encode()).hexdigest()[:8]
    whys = {}
    for _, w in sig: whys[str(w)] = whys.get(str(w), 0) + 1
    print(json.dumps({"step": i, "s": round(dt, 4), "retries": r1 - r0, "n": len(sig), "sig": h,
                      "whys": whys, "nouts": len(outs), "ndiff": None if diff is None else len(diff),
                                            "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}), flush=True)
    if variant == "freeze" and i == 4:
        frozen["rec"] = list(log)
    times.append(dt); rets.append(r1 - r0); prev = sig; r0 = r1

tail = times[8:]
print("SUMMARY", variant, os.environ.get("LMS_SWAP_PATH", "repo"), "steps 8..%d mean %.4f s" % (NSTEPS - 1, sum(tail) / len(tail)),
      "retries in them", sum(rets[8:]), "per step", rets, flush=True)
