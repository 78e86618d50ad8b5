"""How fast can host memory be pinned for swap space, and what does giving it back cost?

The pinned pool of lms_swap maps each buffer with mmap (2 MiB pages advised) and pins
it with cudaHostRegister on the training thread.  On the H100 machine that ran at 1-2 GB/s
(run 48's probe, records/runs.jsonl) and dominated the warm-up steps (98 s for
EfficientNet-B3 at 2x, run 73).  Registering fresh pages includes the kernel faulting
in and zero-filling every page; this script separates the two, to find out whether
touching the pages first from several threads makes pinning faster:

  register       mmap + MADV_HUGEPAGE + cudaHostRegister (what the pool does)
  touch N        the same pages first written from N threads (one byte a 4 KiB page),
                 then cudaHostRegister; the two times are shown apart
  host_alloc     torch.empty(pin_memory=True) (PyTorch's own pinned allocator)
  busy           cudaHostUnregister with GPU work queued (does it wait for the queue?)
                 and the munmap after it
  unregister     cudaHostUnregister of a registered buffer (what the pool's releaser
                 thread does; the driver holds a lock meanwhile: run 67 saw the
                 training thread's cudaMemcpyAsync wait 0.3 s behind it)

Each buffer is checked to be pinned by a device-to-host copy into it (pinned memory
runs at ~54 GB/s on the H100, pageable at ~10).

    python3 examples/pytorch/benchmarks/pin_rate.py --gib 8 --threads 1 4 8 16
"""
from __future__ import annotations

import argparse
import mmap
import time

import torch


def _map(nbytes: int) -> tuple:
    m = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m, torch.frombuffer(m, dtype=torch.uint8)


def _register(buf: torch.Tensor) -> float:
    rt = torch.cuda.cudart()
    t0 = time.perf_counter()
    err = int(rt.cudaHostRegister(buf.data_ptr(), buf.numel(), 0))
    dt = time.perf_counter() - t0
    if err != 0:
        raise RuntimeError(f"cudaHostRegister failed with error {err}")
    return dt


def _unregister(buf: torch.Tensor) -> float:
    rt = torch.cuda.cudart()
    t0 = time.perf_counter()
    err = int(rt.cudaHostUnregister(buf.data_ptr()))
    dt = time.perf_counter() - t0
    if err != 0:
        raise RuntimeError(f"cudaHostUnregister failed with error {err}")
    return dt


def _copy_rate(buf: torch.Tensor, src: torch.Tensor) -> float:
    """GB/s of a device->host copy into ``buf`` (non-blocking: pinned memory only)."""
    n = min(buf.numel(), src.numel())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    buf[:n].copy_(src[:n], non_blocking=True)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0) / 1e9


def _busy_unregister(src: torch.Tensor, gib: int = 1, n: int = 4) -> None:
    """Does cudaHostUnregister wait for work queued on the GPU (as the pool's releaser
    thread does it while a step runs)?  Each of ``n`` registered buffers is unpinned
    right after about 0.5 s of matrix products were queued; then the unmapping is timed."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    k = max(1, int(0.5 / per))
    nb = gib << 30
    for i in range(n):
        m, buf = _map(nb)
        buf[::4096].fill_(0)
        _register(buf)
        buf[:src.numel()].copy_(src[:nb], non_blocking=True)
        torch.cuda.synchronize()
        for _ in range(k):
            a @ a
        du = _unregister(buf)
        ts = time.perf_counter()
        torch.cuda.synchronize()
        rest = time.perf_counter() - ts
        del buf
        tm = time.perf_counter()
        m.close()
        dm = time.perf_counter() - tm
        print(f"busy unregister {gib} GiB with {k * per:.2f} s of work queued: unregister "
              f"{du:.3f} s, queue left after it {rest:.3f} s; munmap {dm:.3f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=8.0, help="buffer size per trial")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16])
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pin_rate.py needs a CUDA GPU")
    nbytes = int(a.gib * (1 << 30))
    gb = nbytes / 1e9
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB to copy from

    m, buf = _map(nbytes)
    dt = _register(buf)
    print(f"register      {gb:.1f} GB: {dt:.2f} s = {gb / dt:.2f} GB/s; "
          f"d2h into it {_copy_rate(buf, src):.1f} GB/s", flush=True)
    du = _unregister(buf)
    print(f"unregister    {gb:.1f} GB: {du:.3f} s = {gb / du:.1f} GB/s", flush=True)
    del buf
    m.close()

    for n in a.threads:
        torch.set_num_threads(n)
        m, buf = _map(nbytes)
        t0 = time.perf_counter()
        buf[::4096].fill_(1)  # one byte a page: the kernel faults in and zeroes each
        dt_touch = time.perf_counter() - t0
        dt_reg = _register(buf)
        total = dt_touch + dt_reg
        print(f"touch {n:2d} + register {gb:.1f} GB: touch {dt_touch:.2f} s, register "
              f"{dt_reg:.2f} s, together {gb / total:.2f} GB/s; "
              f"d2h into it {_copy_rate(buf, src):.1f} GB/s", flush=True)
        _unregister(buf)
        del buf
        m.close()

    _busy_unregister(src)

    t0 = time.perf_counter()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dt = time.perf_counter() - t0
    print(f"host_alloc    {gb:.1f} GB: {dt:.2f} s = {gb / dt:.2f} GB/s; "
          f"d2h into it {_copy_rate(pinned, src):.1f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
