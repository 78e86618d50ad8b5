import sys, gc, torch
sys.path.insert(0, "examples/pytorch")
from lms_swap_loader import load_lms_swap
m = load_lms_swap(prefer_patched=False)
g = m.load_guard(required=True)
N, H, L = 1024, 1024, 4
torch.manual_seed(0)
net = torch.nn.Sequential(*[mm for _ in range(L) for mm in (torch.nn.Linear(H, H), torch.nn.GELU())]).cuda()
x = torch.randn(N, H, device="cuda")
for kind in ("untyped_storage", "is_contiguous+stride", "state+alloc"):
    held = []
    sw = m.ActivationSwapper(guard=True, size_threshold=1 << 20)
    def pack(t):
        if kind == "untyped_storage": t.untyped_storage().nbytes()
        elif kind == "is_contiguous+stride": m._dense_span(t); t._version
        else:
            st = sw._state(t); sw._allocated(st)
        o = g.Slot(t); held.append(o); return o
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda o: o.device_tensor()):
        h = x
        for layer in net: h = layer(h)
        loss = h.pow(2).mean()
    del h; gc.collect()
    print(kind, [o.owners for o in held], flush=True)
    loss.backward(); del loss, held
