import mmap, time, torch
n = 4 << 30
d = torch.empty(n, dtype=torch.uint8, device="cuda")
for populate in (False, True, False, True):
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
    t0 = time.perf_counter()
    m = mmap.mmap(-1, n, flags=flags)
    t1 = time.perf_counter()
    b = torch.frombuffer(m, dtype=torch.uint8)
    b.copy_(d); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"populate={populate}: map {n/(t1-t0)/1e9:.1f} GB/s, copy {n/(t2-t1)/1e9:.1f} GB/s, "
          f"together {n/(t2-t0)/1e9:.1f} GB/s", flush=True)
    del b; m.close()
