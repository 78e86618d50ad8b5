"""Fixtures for the GPU conformance tests of LMS activation swapping (lms_swap).

They import the repository's activation-swapping package (``lms-swap/``, the same files the patch
places as ``torch.cuda.lms_swap``) as ``lms_swap`` on whatever PyTorch is installed (stock torch 2.11
on the GPU machine).
"""
from __future__ import annotations

import gc
import pathlib
import sys

import pytest

from tests.gpu_requirements import missing

REPO = pathlib.Path(__file__).resolve().parents[3]


def _load():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from swap_package import import_lms_swap  # the checkout's package, or the installed one
    return import_lms_swap()


@pytest.fixture(scope="session")
def lms_swap():
    pytest.importorskip("torch")
    return _load()


@pytest.fixture(scope="session", autouse=True)
def deterministic_kernels():
    """Bitwise comparisons need deterministic kernels (cuDNN's default weight-gradient
    algorithms use atomics, so even two stock runs can differ in the last bit)."""
    torch = pytest.importorskip("torch")
    old = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old


@pytest.fixture
def cuda_clean():
    """Skips without CUDA; collects garbage around the test.  (Device memory is not
    compared here: cuBLAS/cuDNN keep per-stream workspaces in the caching allocator;
    the leak tests compare memory after a warm-up round instead.)"""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        missing("CUDA not available")
    gc.collect()
    torch.cuda.synchronize()
    yield
    gc.collect()
    torch.cuda.synchronize()


@pytest.fixture(autouse=True)
def pinned_host_buffers(request, monkeypatch):
    """Every host buffer a CUDA swapper's pool hands out must be pinned (pin_check.py): a pool
    that fell back to pageable memory fails the test at its first swap."""
    if "lms_swap" not in request.fixturenames:
        return
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from pin_check import check_cuda_swappers
    check_cuda_swappers(request.getfixturevalue("lms_swap"), monkeypatch)
