"""What a GPU test does when the machine lacks something it needs (a tool, a bundle, a build).

Under `-m gpu` (`make conformance`, or LMS_CONFORMANCE_REPORT set) the run is there to prove the GPU
side, so a missing compute-sanitizer, CUDA toolkit, `.device/tf` bundle or gtest build is a failure
that names it; anywhere else (a GPU machine running the whole suite) the test skips with the reason.
tests/conftest.py sets GPU_RUN when the session starts.
"""
from __future__ import annotations

import pytest

GPU_RUN = False


def missing(reason: str) -> None:
    """Fail under a GPU run, else skip, with ``reason``."""
    if GPU_RUN:
        pytest.fail(f"{reason} (a GPU run needs it: under -m gpu this is a failure, not a skip)",
                    pytrace=False)
    pytest.skip(reason)
