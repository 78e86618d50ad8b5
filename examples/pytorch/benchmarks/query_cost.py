import torch, time
torch.cuda.init(); x = torch.empty(1<<20, device='cuda')
for f,name in [(lambda: torch.cuda.memory_allocated(0),'memory_allocated'),(lambda: torch.cuda.max_memory_allocated(0),'max_memory_allocated'),(lambda: torch.cuda.mem_get_info(0),'mem_get_info'),(lambda: torch.cuda.current_stream(),'current_stream')]:
    f(); t=time.perf_counter()
    for _ in range(2000): f()
    print(f"{name}: {(time.perf_counter()-t)/2000*1e6:.1f} us")
