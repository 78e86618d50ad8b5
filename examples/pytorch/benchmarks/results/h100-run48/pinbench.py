import mmap, time, torch
rt = torch.cuda.cudart()
print(open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
      open("/sys/kernel/mm/transparent_hugepage/defrag").read().strip())
n = 8 << 30
for huge in (False, True, False, True):
    m = mmap.mmap(-1, n)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    b = torch.frombuffer(m, dtype=torch.uint8)
    t0 = time.perf_counter()
    err = rt.cudaHostRegister(b.data_ptr(), n, 0)
    t1 = time.perf_counter()
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t2 = time.perf_counter(); b.copy_(d, non_blocking=True); torch.cuda.synchronize(); t3 = time.perf_counter()
    rt.cudaHostUnregister(b.data_ptr())
    # pageable copy into a fresh mapping
    m2 = mmap.mmap(-1, n)
    if huge:
        m2.madvise(mmap.MADV_HUGEPAGE)
    b2 = torch.frombuffer(m2, dtype=torch.uint8)
    t4 = time.perf_counter(); b2.copy_(d); torch.cuda.synchronize(); t5 = time.perf_counter()
    t6 = time.perf_counter(); b2.copy_(d); torch.cuda.synchronize(); t7 = time.perf_counter()
    print(f"huge={huge} register {n/(t1-t0)/1e9:.1f} GB/s (err {int(err)}), pinned d2h {n/(t3-t2)/1e9:.1f} GB/s, "
          f"pageable d2h fresh {n/(t5-t4)/1e9:.1f} GB/s, again {n/(t7-t6)/1e9:.1f} GB/s", flush=True)
    del b, b2, d; m.close(); m2.close()
