"""Running a benchmark on a card larger than the one its batches were measured on.

The base batches in the benchmarks' commands are stock's largest on an 80 GB H100.  On a
larger card (an H200's 141 GB) those batches, and their 1.5x, fit without any swapping, so
a run there measures nothing.  A parent given ``--device-gib`` passes the size to its
children in ``LMS_BENCH_DEVICE_GIB``; each child then takes no more of the card than a
card of that size would give it, with its own CUDA context outside as there:

``torch.cuda.set_per_process_memory_fraction``, which lms_swap's forecast reads as the device's
size and the pluggable LMS allocator takes as its LMS limit.  Under the pluggable allocator it
is applied after the allocator is installed: any earlier ``torch.cuda`` call initializes the
native allocator, and PyTorch then refuses to change it.

Where the held card is stricter than the real one: under a fraction, PyTorch's caching
allocator refuses a new mapping when what it has reserved plus the *whole* request would pass
the fraction, before expandable segments would map only the pages the request lacks.  Near
the top, a request a real card serves from the segment's free tail plus a few new pages is
refused here, and the allocator releases its cache and retries.  Stock's UNet at its largest
batch (417) releases none in 14 steps on an H100 and 28 on an H200 held to its size
(records/zoo.jsonl, runs 53-132 against 140-202), so a held card's figures for a model near
its edge can be lower than the H100's, not higher.

``--device-hold ballast`` holds the card the other way, as the driver sees it: the child
takes the larger card's surplus (its total less the asked size) with the driver's
``cuMemAlloc`` before anything else, outside PyTorch's allocator, so that a mapping fails
where it would fail on the smaller card and nowhere sooner.  lms_swap's limit under its
eviction net is the card's free memory plus what the allocator holds, so it reads the
smaller card as there; without the net it reads the card's total, so this hold is for runs
with the net.  The pluggable LMS allocator alone, with no LMS limit, maps until the card's
free memory would fall under its foreign reserve, so a ballast holds it as the smaller card
would: where the driver refuses, and where cuBLAS handles and lazily loaded kernels, allocated
outside it, must still find room.  Its margins are fractions of the card's total, which the
ballast leaves the larger card's (an H200's reserve is 2.2 GiB, an H100's 1.2), so it keeps a
little more free than on the smaller card, never less.  With activation swapping on top,
the layer reads the pluggable allocator's limit as the card, so there the child holds by the
fraction whatever was asked, and says so in what ``apply`` returns.

Host memory is not capped: the machines with the larger cards have as much or more.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

__all__ = ["ENV", "H100_GIB", "HOLDS", "HOLD_ENV", "add_option", "apply", "gib", "hold",
           "parse", "pass_to_children"]

ENV = "LMS_BENCH_DEVICE_GIB"
HOLD_ENV = "LMS_BENCH_DEVICE_HOLD"
HOLDS = ("fraction", "ballast")
# torch.cuda.get_device_properties(0).total_memory on the H100 80GB HBM3 the batches were
# measured on (85,017,853,952 bytes)
H100_GIB = 85_017_853_952 / (1 << 30)
GiB = 1 << 30


def parse(value: str) -> float:
    """``--device-gib``'s value: a number of GiB above 0, or ``h100``."""
    if value.strip().lower() == "h100":
        return H100_GIB
    try:
        size = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not a number of GiB, nor 'h100'") from None
    if not size > 0 or size != size or size == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: must be a finite number above 0")
    return size


def add_option(ap: argparse.ArgumentParser) -> None:
    """A parent's ``--device-gib``."""
    ap.add_argument("--device-gib", type=parse, default=None, metavar="GIB",
                    help="hold every configuration to a card of this many GiB (on a larger "
                         "card: 'h100' for the 80 GB H100 the base batches were measured on)")
    ap.add_argument("--device-hold", choices=HOLDS, default="fraction",
                    help="how --device-gib holds the card: 'fraction' (PyTorch's memory "
                         "fraction; stricter than the real card near its edge) or 'ballast' "
                         "(the surplus taken from the driver first, so the card fails where "
                         "the smaller one would; needs lms_swap's eviction net or the "
                         "pluggable LMS allocator alone)")


def pass_to_children(size: Optional[float], how: str = "fraction") -> None:
    """Puts ``--device-gib`` and ``--device-hold`` where this process's children (and its
    record) read them."""
    if how not in HOLDS:
        raise ValueError(f"device hold {how!r}: give one of {', '.join(HOLDS)}")
    if size is None and how != "fraction":
        raise SystemExit(f"--device-hold {how} holds nothing without --device-gib")
    if size is not None:
        os.environ[ENV] = repr(size)
        os.environ[HOLD_ENV] = how


def gib() -> Optional[float]:
    """The card size this process's parent asked for, or None for the whole card."""
    v = os.environ.get(ENV, "").strip()
    if not v:
        return None
    try:
        size = float(v)
    except ValueError:
        raise SystemExit(f"{ENV}={v!r}: not a number of GiB") from None
    if size <= 0:
        raise SystemExit(f"{ENV}={v!r}: must be more than 0 GiB")
    return size


def hold() -> str:
    """How this process's parent asked the card to be held (``fraction`` where it did not say)."""
    v = os.environ.get(HOLD_ENV, "").strip().lower() or "fraction"
    if v not in HOLDS:
        raise SystemExit(f"{HOLD_ENV}={v!r}: give one of {', '.join(HOLDS)}")
    return v


# the ballast's device pointers: held for the process's life, never freed
_BALLAST: List[int] = []


def _pluggable_on() -> bool:
    mod = sys.modules.get("lms_swap.allocator")
    return bool(mod is not None and mod.enabled())


def _take_ballast(torch, nbytes: int) -> int:
    """Takes ``nbytes`` of the current device from the driver (``cuMemAlloc``, on the primary
    context PyTorch uses), outside PyTorch's allocator; returns how far the device's free
    memory fell."""
    import ctypes
    free_before, _ = torch.cuda.mem_get_info()  # the runtime makes its context current here
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise SystemExit(f"--device-hold ballast needs the CUDA driver (libcuda.so.1): {e}") from None
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemAlloc_v2.restype = ctypes.c_int
    ptr = ctypes.c_uint64(0)
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise SystemExit(f"--device-hold ballast: the driver refused {nbytes} bytes "
                         f"(cuMemAlloc CUresult {rc}); {free_before} bytes were free")
    _BALLAST.append(ptr.value)
    free_after, _ = torch.cuda.mem_get_info()
    return int(free_before) - int(free_after)


def _allocator_bytes(torch, size_gib: float) -> int:
    """What the allocator may take on a card of ``size_gib``: the card less this process's
    CUDA context (what a fresh process sees in use before it allocates)."""
    free, total = torch.cuda.mem_get_info()
    return int(size_gib * GiB) - (total - free)


def apply(torch, swapping: bool = False) -> Optional[dict]:
    """Caps the process's allocator to the asked size; call it before the model is built, and
    under the pluggable allocator after installing it; ``swapping``: activation swapping will
    run in this process.  Returns what it did (for the child's RESULT), or None where nothing
    was asked or the card is no larger."""
    size = gib()
    if size is None:
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    if size * GiB >= total:
        return None
    how = hold()
    if how == "ballast" and not (swapping and _pluggable_on()):
        taken = _take_ballast(torch, total - int(size * GiB))
        return {"device_gib": size, "hold": "ballast", "ballast_bytes": taken}
    cap = _allocator_bytes(torch, size)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    out = {"device_gib": size, "hold": "fraction", "allocator_cap_bytes": cap}
    if how == "ballast":
        out["ballast_refused"] = ("activation swapping reads the pluggable LMS allocator's "
                                  "limit, the fraction, as the card")
    return out
