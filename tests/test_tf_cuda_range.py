"""One CUDA range for TensorFlow: the profile's [build.full] cuda is what the full build checks nvcc
against, what `make build TF=<tag> DRY_RUN=1` names, and what the LMS page backend is compiled against
here, at its lowest and highest CUDA headers (NVIDIA's header wheels), with LMS compiled in; below the
range, the backend's guard compiles LMS out (CUDA 11.7 headers).

The page backend compiles against the official tensorflow-cpu wheel's headers (cached like the
allocator build's, $LMS_TF_WHEEL_CACHE) in the LMS tree composed from this checkout's sources.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


from build_tools import catalog
from build_tools.verify import tf_allocator
from build_tools.verify.tf_cuda_range import PAGE_BACKEND, compile_page_backend, cuda_range, lms_floor, range_ends
from build_tools.verify.tf_release import tf_profile

ROOT = Path(__file__).resolve().parents[1]
TF_CACHE = Path(os.environ.get("LMS_TF_WHEEL_CACHE", tf_allocator.DEFAULT_CACHE))
PROF = tf_profile()
COMPILED_OUT = b"host-located VMM pages"   # the error a backend without LMS returns


def test_the_page_backend_guard_is_the_lower_bound_of_the_profile_range():
    backend = catalog.source_map(PROF.framework, PROF.tag)[PAGE_BACKEND].read_text()
    spec = cuda_range(PROF)
    assert re.match(rf">={re.escape(lms_floor(backend))},", spec), (spec, lms_floor(backend))
    assert range_ends(PROF)[0] == lms_floor(backend)


def test_make_dry_run_names_the_one_cuda_range():
    r = subprocess.run(["make", "--no-print-directory", "build", f"TF={PROF.tag}", "DRY_RUN=1", f"PY={sys.executable}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    named = set(re.findall(r"CUDA (?:toolkit\) )?([<>=][^\s:]*\d)", r.stdout))
    assert named == {cuda_range(PROF)}, r.stdout


def _compile(tree: Path, cuda: str, out: Path) -> bytes:
    return compile_page_backend(tree, cuda, out, cache=TF_CACHE, tag=PROF.tag).read_bytes()


def test_the_page_backend_compiles_with_lms_at_both_ends_of_the_range(lms_tree, tmp_path):
    tree = lms_tree("tensorflow", PROF.tag)
    for cuda in range_ends(PROF):
        obj = _compile(tree, cuda, tmp_path / cuda)
        assert b"CreateGpuLmsPageBackend" in obj and COMPILED_OUT not in obj, cuda


def test_below_the_range_the_guard_compiles_lms_out(lms_tree, tmp_path):
    obj = _compile(lms_tree("tensorflow", PROF.tag), "11.7", tmp_path / "11.7")
    assert COMPILED_OUT in obj
