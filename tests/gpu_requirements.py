"""What a GPU test does when the machine lacks something it needs (a tool, a bundle, a build).

Under `-m gpu` (`make conformance`, or LMS_CONFORMANCE_REPORT set) the run is there to prove the GPU
side, so a missing compute-sanitizer, CUDA toolkit, `.device/tf` bundle or gtest build is a failure
that names it; anywhere else (a GPU machine running the whole suite) the test skips with the reason.
tests/conftest.py sets GPU_RUN when the session starts.
"""
from __future__ import annotations

import os
import shutil

import pytest

GPU_RUN = False


def missing(reason: str) -> None:
    """Fail under a GPU run, else skip, with ``reason``."""
    if GPU_RUN:
        pytest.fail(f"{reason} (a GPU run needs it: under -m gpu this is a failure, not a skip)",
                    pytrace=False)
    pytest.skip(reason)


def compute_sanitizer(*cuda_homes) -> str:
    """compute-sanitizer on PATH, else in ``bin/`` of the first of ``cuda_homes`` that has it;
    :func:`missing` where none does."""
    found = shutil.which("compute-sanitizer") or next(
        (c for c in (os.path.join(str(h), "bin", "compute-sanitizer") for h in cuda_homes)
         if os.path.exists(c)), None)
    if not found:
        missing("compute-sanitizer not found")
    return found
