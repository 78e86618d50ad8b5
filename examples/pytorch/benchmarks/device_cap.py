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

Host memory is not capped: the machines with the larger cards have as much or more.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional

__all__ = ["ENV", "H100_GIB", "add_option", "apply", "gib", "parse", "pass_to_children"]

ENV = "LMS_BENCH_DEVICE_GIB"
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


def pass_to_children(size: Optional[float]) -> None:
    """Puts ``--device-gib`` where this process's children (and its record) read it."""
    if size is not None:
        os.environ[ENV] = repr(size)


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


def _allocator_bytes(torch, size_gib: float) -> int:
    """What the allocator may take on a card of ``size_gib``: the card less this process's
    CUDA context (what a fresh process sees in use before it allocates)."""
    free, total = torch.cuda.mem_get_info()
    return int(size_gib * GiB) - (total - free)


def apply(torch) -> Optional[dict]:
    """Caps the process's allocator to the asked size; call it before the model is built, and
    under the pluggable allocator after installing it.  Returns what it did (for the child's
    RESULT), or None where nothing was asked or the card is no larger."""
    size = gib()
    if size is None:
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    if size * GiB >= total:
        return None
    cap = _allocator_bytes(torch, size)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    return {"device_gib": size, "allocator_cap_bytes": cap}
