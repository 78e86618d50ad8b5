"""The files of the LMS tree the allocator program is built from, and where the LMS ones come from."""
from __future__ import annotations

from pathlib import Path

from ... import catalog
from ..tf_release import REPO, tf_profile

__all__ = ["CONFORMANCE", "OPTIONAL_TREE_SOURCES", "TREE_CUDA_HEADERS", "TREE_CUDA_SOURCES", "TREE_HEADERS",
           "TREE_SOURCES", "UPSTREAM_TEST", "lms_sources"]

CONFORMANCE = REPO / "tests" / "conformance" / "tensorflow_allocator"

# Files of the (LMS) tree the program needs.
TREE_HEADERS = [
    "tensorflow/tsl/framework/bfc_allocator.h",
    "tensorflow/tsl/framework/bfc_chunk_handle_table.h",
    "tensorflow/tsl/framework/lms_sub_allocator.h",
    "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.h",
    "tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.h",
    # the launch gate's core (patches/shared/, placed by patches/tensorflow/shared.toml): included
    # by the CUDA page backend, and by lms_cupti_search_test.cc on both targets
    "tensorflow/core/common_runtime/gpu/gpu_lms_launch_gate_core.inc",
]
TREE_SOURCES = [
    "tensorflow/tsl/framework/bfc_allocator.cc",
    "tensorflow/tsl/framework/bfc_allocator_lms.cc",
    "tensorflow/tsl/framework/bfc_chunk_handle_table.cc",
    "tensorflow/tsl/framework/lms_page_moves.cc",
    "tensorflow/tsl/framework/lms_posix_page_backend.cc",
    "tensorflow/tsl/framework/lms_settings.cc",
    "tensorflow/tsl/framework/lms_sub_allocator.cc",
    "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator.cc",
]
# LMS files an older tree (a patch from before they were split out) lacks: skipped when absent, so
# that the new tests can be built against the old code to show them failing there.
OPTIONAL_TREE_SOURCES = {"tensorflow/tsl/framework/lms_page_moves.cc",
                         "tensorflow/tsl/framework/lms_settings.cc"}
TREE_CUDA_HEADERS: list[str] = []
TREE_CUDA_SOURCES = ["tensorflow/core/common_runtime/gpu/gpu_lms_page_backend.cc"]
UPSTREAM_TEST = "tensorflow/core/common_runtime/gpu/gpu_bfc_allocator_test.cc"


def lms_sources(tag: str | None = None) -> dict[str, Path]:
    """The LMS files the exported patch adds, by upstream path -> file in patches/: the layers of
    ``catalog.source_map`` (patches/tensorflow/src/, the patches/shared/ files that
    patches/tensorflow/shared.toml places, patches/tensorflow/<tag>/src/). Default tag: the profile's
    (:func:`..tf_release.tf_profile`)."""
    prof = tf_profile(tag)
    return catalog.source_map(prof.framework, prof.tag)
