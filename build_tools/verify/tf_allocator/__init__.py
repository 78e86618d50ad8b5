"""Standalone build of TensorFlow's BFC allocator with Large Model Support.

A full TensorFlow build (bazel, pinned dependencies, hours) is impossible on
the project's machines, so the LMS allocator is proven on its own: the patched
allocator translation units of the tree are compiled against the official
``tensorflow-cpu`` wheel of the same release's ``tensorflow/include/`` and linked
with its ``libtensorflow_framework.so.2`` into one gtest program holding

* TensorFlow's own BFC allocator tests
  (``tensorflow/core/common_runtime/gpu/gpu_bfc_allocator_test.cc`` of the
  tree, adapted by :func:`adapt_upstream_test` only as much as a standalone
  build needs), and
* the LMS conformance tests (``tests/conformance/tensorflow_allocator``).

Targets: ``cpu`` (host memory: memfd page backend) and ``cuda`` (CUDA VMM page
backend and GPU kernels; built here with nvcc, run on the GPU machine).
The release is the profile's (:mod:`build_tools.verify.tf_release`; ``--tag``).

sources.py        the tree's files the program is built from; the LMS ones from patches/
wheel.py          the official tensorflow-cpu wheel (headers, libtensorflow_framework.so.2)
upstream_test.py  TensorFlow's gpu_bfc_allocator_test.cc, adapted
program.py        compile and link (build)
gtest.py          run it; the LMS tests it must hold
python_overlay.py the Python and proto edits against stock TensorFlow
CLI: python -m build_tools.verify.tf_allocator --help
"""
from .gtest import LMS_TESTS, WRITERS_TEST, gtest_results, run_tests
from .program import CUDA_HOME, build, compile_job
from .sources import UPSTREAM_TEST, lms_sources
from .upstream_test import adapt_upstream_test
from .wheel import DEFAULT_CACHE, ensure_wheel, wheel_dir, wheel_file, wheel_pins, wheel_python

__all__ = ["CUDA_HOME", "DEFAULT_CACHE", "LMS_TESTS", "UPSTREAM_TEST", "WRITERS_TEST", "adapt_upstream_test", "build",
           "compile_job", "ensure_wheel", "gtest_results", "lms_sources", "run_tests", "wheel_dir", "wheel_file",
           "wheel_pins", "wheel_python"]
