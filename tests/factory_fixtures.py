"""Small real git repositories for testing the patch factory and patch operations.

`make_upstream()` builds a git repo shaped like a PyTorch tree (version.txt, c10/cuda/...) with several
release tags; `make_patches_dir()` builds a patches/ folder with a profile, an LMS source file and an
edit of an upstream file. Everything is plain git and plain files; nothing is mocked.
"""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

ALLOCATOR_V260 = textwrap.dedent("""\
    // CUDACachingAllocator.cpp (test tree)
    #include "CUDACachingAllocator.h"
    namespace c10::cuda {
    void* malloc_block(size_t size) {
      return raw_alloc(size);
    }
    void free_block(void* p) {
      raw_free(p);
    }
    }  // namespace c10::cuda
    """)

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
       "PATH": "/usr/bin:/bin"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def make_upstream(root: Path) -> Path:
    """Tags: v2.6.0; v2.6.1 (an unrelated file changes); v2.7.0 (the allocator's lines change)."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    write(root, "version.txt", "2.6.0a0\n")
    write(root, "c10/cuda/CUDACachingAllocator.cpp", ALLOCATOR_V260)
    write(root, "c10/cuda/CUDACachingAllocator.h", "#pragma once\n#include <cstddef>\n")
    write(root, "torch/cuda/__init__.py", "def is_available():\n    return True\n")
    write(root, "README.md", "test tree\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "2.6.0")
    git(root, "tag", "v2.6.0")
    write(root, "version.txt", "2.6.1a0\n")
    write(root, "README.md", "test tree, patch release\n")
    git(root, "commit", "-qam", "2.6.1")
    git(root, "tag", "v2.6.1")
    write(root, "version.txt", "2.7.0a0\n")
    write(root, "c10/cuda/CUDACachingAllocator.cpp",
          ALLOCATOR_V260.replace("return raw_alloc(size);", "return raw_alloc_v2(size, stream);"))
    git(root, "commit", "-qam", "2.7.0")
    git(root, "tag", "v2.7.0")
    return root


EDIT = textwrap.dedent("""\
    From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
    From: LMS Build Tools <lms-build-tools@users.noreply.github.com>
    Date: Sun, 22 Nov 2026 00:00:00 +0000
    Subject: [PATCH] Call the LMS hook when allocating

    ---
     c10/cuda/CUDACachingAllocator.cpp | 2 +-
     1 file changed, 1 insertion(+), 1 deletion(-)

    diff --git a/c10/cuda/CUDACachingAllocator.cpp b/c10/cuda/CUDACachingAllocator.cpp
    --- a/c10/cuda/CUDACachingAllocator.cpp
    +++ b/c10/cuda/CUDACachingAllocator.cpp
    @@ -2,7 +2,7 @@
     #include "CUDACachingAllocator.h"
     namespace c10::cuda {
     void* malloc_block(size_t size) {
    -  return raw_alloc(size);
    +  return lms::alloc_or_spill(size);
     }
     void free_block(void* p) {
       raw_free(p);
    """)


def make_patches_dir(root: Path) -> Path:
    """patches/ for PyTorch v2.6.0 and v2.6.1 with one LMS source file and one edit."""
    for tag, version in (("v2.6.0", "2.6.0"), ("v2.6.1", "2.6.1")):
        write(root, f"pytorch/{tag}/profile.toml", f'[upstream]\nversion = "{version}"\n')
        write(root, f"pytorch/{tag}/0001-Call-the-LMS-hook-when-allocating.patch", EDIT)
    write(root, "pytorch/src/c10/cuda/CUDALargeModelSupport.cpp",
          '// LMS (test source)\nnamespace lms {\nvoid* alloc_or_spill(unsigned long n);\n}\n')
    write(root, "pytorch/src/torch/cuda/lms.py", "def set_enabled_lms(on):\n    return bool(on)\n")
    return root
