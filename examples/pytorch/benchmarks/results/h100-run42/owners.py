import sys, gc, torch
sys.path.insert(0, "examples/pytorch")
from lms_swap_loader import load_lms_swap
m = load_lms_swap(prefer_patched=False)
g = m.load_guard(required=True)
def uc(t): return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 1
N, H, L = 1024, 1024, 4
torch.manual_seed(0)
net = torch.nn.Sequential(*[mm for _ in range(L) for mm in (torch.nn.Linear(H, H), torch.nn.GELU())]).cuda()
x = torch.randn(N, H, device="cuda")
# (a) a bare pack hook holding a Slot, and one holding t.data
for kind in ("slot", "data"):
    held = []
    def pack(t):
        o = g.Slot(t) if kind == "slot" else t.data
        held.append(o); return o
    def unpack(o): return o.device_tensor() if kind == "slot" else o
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        h = x
        for layer in net: h = layer(h)
        loss = h.pow(2).mean()
    del h; gc.collect()
    print(kind, [o.owners if kind == "slot" else uc(o) for o in held], flush=True)
    loss.backward(); del loss, held
# (b) through lms_swap, variants
orig = m.ActivationSwapper._keep_evictable
import weakref
for variant in ("as is", "no orig weakref", "dedupe off", "both"):
    hs = []
    def rec(self, t, n):
        h = orig(self, t, n)
        if h is not None and variant in ("no orig weakref", "both"):
            h.orig = lambda: None
        hs.append(h); return h
    m.ActivationSwapper._keep_evictable = rec
    sw = m.ActivationSwapper(guard=True, size_threshold=1 << 20,
                             dedupe=variant not in ("dedupe off", "both"))
    with sw:
        h = x
        for layer in net: h = layer(h)
        loss = h.pow(2).mean()
    del h; gc.collect()
    print(variant, [hh.slot.owners for hh in hs if hh is not None], flush=True)
    loss.backward(); del loss, hs, sw; gc.collect()
print(g.stats())
