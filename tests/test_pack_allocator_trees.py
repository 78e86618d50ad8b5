"""The allocator conformance suite's tree pack (tests/conformance/pytorch_allocator/pack_trees.py)
on the real v2.6.0 tree: the LMS side carries the composed change, the pristine side does not,
and nothing else of the tree comes along but the two Python files the memory_stats scenario runs
(torch/cuda/memory.py, and lms.py on the LMS side)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "conformance" / "pytorch_allocator" / "pack_trees.py"


def test_pack_carries_c10_with_and_without_lms(tmp_path):
    spec = importlib.util.spec_from_file_location("pack_trees", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    made = mod.pack(tmp_path / "pack", "v2.6.0", "debian")
    lms, pristine = made["lms"], made["pristine"]
    assert sorted(p.name for p in lms.iterdir()) == ["c10", "torch"]
    assert sorted(p.name for p in (lms / "torch" / "cuda").iterdir()) == ["lms.py", "memory.py"]
    assert sorted(p.name for p in (pristine / "torch" / "cuda").iterdir()) == ["memory.py"]
    assert "lms" in (lms / "torch" / "cuda" / "memory.py").read_text()
    assert (lms / "c10" / "cuda" / "CUDALargeModelSupport.cpp").is_file()
    assert not (pristine / "c10" / "cuda" / "CUDALargeModelSupport.cpp").exists()
    ours = (REPO / "patches" / "pytorch" / "src" / "c10" / "cuda" / "CUDALargeModelSupport.cpp").read_bytes()
    assert (lms / "c10" / "cuda" / "CUDALargeModelSupport.cpp").read_bytes() == ours
    alloc = "c10/cuda/CUDACachingAllocator.cpp"
    assert (lms / alloc).read_bytes() != (pristine / alloc).read_bytes()   # the edit series applied
    size = sum(f.stat().st_size for f in (tmp_path / "pack").rglob("*") if f.is_file())
    assert size < 40 * 2**20                                               # fits a device carry
