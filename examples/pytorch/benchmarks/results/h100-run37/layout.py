"""Run 37 diagnostic: the caching allocator's expandable segment over one GPT-2 step at
batch 34 (after 6 steps), replayed from torch.cuda.memory._record_memory_history: before
each allocation of 3 GiB or more and before each retry (the first segment_unmap), the
allocated and mapped bytes, the free mapped runs, and a map of the address space in 1 GiB
buckets (A allocated, a partly allocated, f mapped and free, . unmapped).

    python3 examples/pytorch/benchmarks/results/h100-run37/layout.py lms|stock
"""
import os, sys, pathlib, types, contextlib, time, json, bisect
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = pathlib.Path(__file__).resolve().parents[5]  # the repository
sys.path.insert(0, str(ROOT / "examples/pytorch/benchmarks")); sys.path.insert(0, str(ROOT / "examples/pytorch"))
import torch, bench_lms_swap as B
from lms_swap_loader import load_lms_swap
variant = sys.argv[1]
lms = load_lms_swap(prefer_patched=False) if variant != "stock" else None
model, loss_fn, _, _ = B.build("gpt2", 34, types.SimpleNamespace(image_size=448, seq_len=4096, loss_chunk=512))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with (lms.swapping() if lms else contextlib.nullcontext()):
            loss = loss_fn()
    loss.backward(); opt.step(); torch.cuda.synchronize()
for i in range(6):
    step()
free, total = torch.cuda.mem_get_info()
print("mem_get_info free %.2f GiB total %.2f; reserved %.2f; capacity(free+reserved) %.2f GiB" % (
    free / 2**30, total / 2**30, torch.cuda.memory_reserved() / 2**30, (free + torch.cuda.memory_reserved()) / 2**30))
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=400000)
s0 = torch.cuda.memory._snapshot()
step()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
G = 2**30
# state: mapped intervals and allocated intervals keyed by address
mapped = {}   # addr -> size (page runs)
alloc = {}    # addr -> size
print("s0 segments", len(s0["segments"]), [(hex(x["address"]), round(x["total_size"] / 2**30, 2), x.get("is_expandable"), len(x["blocks"])) for x in s0["segments"]][:6])
for seg in s0["segments"]:
    a = seg["address"]
    for b in seg["blocks"]:
        ba = b.get("address", a)
        if b["state"] in ("active_allocated", "active_pending_free"):
            alloc[ba] = b["size"]
        a = ba + b["size"]
    mapped[seg["address"]] = seg["total_size"]
base = min(mapped) if mapped else 0
def intervals(d):
    return sorted(d.items())
def summarize(tag, req=None):
    # free mapped = mapped minus allocated, merged
    ev = []
    for a, s in mapped.items(): ev.append((a, 1, 0)); ev.append((a + s, -1, 0))
    for a, s in alloc.items(): ev.append((a, 0, 1)); ev.append((a + s, 0, -1))
    ev.sort()
    m = k = 0; last = None; frees = []
    cur_start = None
    for pos, dm, dk in ev:
        if last is not None and pos > last and m > 0 and k == 0:
            if frees and frees[-1][1] == last: frees[-1][1] = pos
            else: frees.append([last, pos])
        m += dm; k += dk; last = pos
    sizes = sorted((e - s for s, e in frees), reverse=True)
    tot_m = sum(mapped.values()); tot_a = sum(alloc.values())
    hi = max((a + s for a, s in mapped.items()), default=base)
    print(f"[{tag}] req {req and round(req / 2**20)} MiB | allocated {tot_a / G:.2f} mapped {tot_m / G:.2f} GiB | "
          f"free-mapped {sum(sizes) / G:.2f} GiB in {len(sizes)} runs, largest (MiB) {[round(x / 2**20) for x in sizes[:8]]} | span {(hi - base) / G:.2f} GiB")
    # 1 GiB buckets: a=allocated, f=free mapped, .=unmapped
    nb = int((hi - base) // G) + 1
    row = []
    for i in range(nb):
        lo, up = base + i * G, base + (i + 1) * G
        a_ = sum(max(0, min(up, a + s) - max(lo, a)) for a, s in alloc.items())
        m_ = sum(max(0, min(up, a + s) - max(lo, a)) for a, s in mapped.items())
        row.append("A" if a_ > 0.9 * G else ("." if m_ < 0.1 * G else ("f" if a_ < 0.1 * G else "a")))
    print("   map:", "".join(row))
trace = snap["device_traces"][0]
print("events", len(trace))
shown = 0
pending_unmap = False
for idx, e in enumerate(trace):
    act, a, s = e["action"], e["addr"], e["size"]
    if act == "alloc" and s >= 3 * G and shown < 12:
        summarize(f"before big alloc at event {idx}", s)
        shown += 1
    if act == "segment_unmap" and not pending_unmap:
        # the request that triggered it is the next alloc
        req = next((x["size"] for x in trace[idx:] if x["action"] == "alloc"), None)
        summarize(f"before retry at event {idx}", req)
        pending_unmap = True
        shown += 1
    if act != "segment_unmap" and act != "segment_map":
        pending_unmap = False
    if act == "alloc":
        alloc[a] = s
    elif act == "free_completed":
        alloc.pop(a, None)
    elif act == "segment_map":
        mapped[a] = s
    elif act == "segment_unmap":
        # remove the range [a, a+s) from mapped
        nm = {}
        for ma, ms in mapped.items():
            if ma + ms <= a or ma >= a + s: nm[ma] = ms; continue
            if ma < a: nm[ma] = a - ma
            if ma + ms > a + s: nm[a + s] = ma + ms - (a + s)
        mapped = nm
    elif act in ("segment_alloc",):
        mapped[a] = s
# big allocations of the step in order, with placement relative to base
print("big allocs (>=512 MiB): idx, MiB, offset GiB")
for idx, e in enumerate(trace):
    if e["action"] == "alloc" and e["size"] >= 512 * 2**20:
        print(" ", idx, round(e["size"] / 2**20), round((e["addr"] - base) / G, 2), end=";")
print()
summarize("end of step")
from collections import Counter
bystream = Counter(); cnt = Counter()
for e in trace:
    if e["action"] == "alloc":
        bystream[e.get("stream")] += e["size"]; cnt[e.get("stream")] += 1
print("alloc bytes by stream:", {hex(k) if isinstance(k, int) else k: (cnt[k], round(v / G, 2)) for k, v in bystream.items()})
far = [(i, round(e["size"] / 2**20), hex(e.get("stream", 0)), round((e["addr"] - base) / G, 1)) for i, e in enumerate(trace)
       if e["action"] == "alloc" and e["addr"] - base > 100 * G]
print("allocs beyond 100 GiB:", len(far), far[:60])
print("events 990-1040:", [(i, e["action"][:6], round(e["size"] / 2**20), round((e["addr"] - base) / G, 1)) for i, e in enumerate(trace) if 990 <= i <= 1040])
segs_end = [(round((x["address"] - base) / G, 1), round(x["total_size"] / G, 2), hex(x.get("stream", 0))) for x in snap["segments"]]
print("segments at end:", segs_end)
