import os, sys, pathlib, types, contextlib, pickle, gzip, time
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
ROOT = pathlib.Path(__file__).resolve().parents[5]  # the repository
sys.path.insert(0, str(ROOT / "examples/pytorch/benchmarks")); sys.path.insert(0, str(ROOT / "examples/pytorch"))
import torch, bench_lms_swap as B
from lms_swap_loader import load_lms_swap
mode, out = sys.argv[1], sys.argv[2]
lms = load_lms_swap(prefer_patched=False) if mode == "lms" else None
model, loss_fn, _, _ = B.build("gpt2", 34, types.SimpleNamespace(image_size=448, seq_len=4096, loss_chunk=512))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with (lms.swapping() if lms else contextlib.nullcontext()):
            loss = loss_fn()
    loss.backward(); opt.step(); torch.cuda.synchronize()
for i in range(5):
    t0 = time.perf_counter(); step(); print("warm", i, round(time.perf_counter()-t0, 4), flush=True)
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=200000)
r0 = torch.cuda.memory_stats()["num_alloc_retries"]
for i in range(3):
    t0 = time.perf_counter(); step()
    print("step", i, round(time.perf_counter()-t0, 4), "retries", torch.cuda.memory_stats()["num_alloc_retries"] - r0, flush=True)
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
# keep only what the analysis needs (no frames)
for tr in snap["device_traces"]:
    for e in tr:
        e.pop("frames", None)
for seg in snap["segments"]:
    for b in seg["blocks"]:
        b.pop("frames", None)
with gzip.open(os.path.join(out, f"snap_{mode}.pkl.gz"), "wb") as f:
    pickle.dump(snap, f)
print("saved", flush=True)
