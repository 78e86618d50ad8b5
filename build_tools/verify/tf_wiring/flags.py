"""The compiler flags of TensorFlow's Linux GPU build, read from the tree being checked.

A ``bazel build --config=opt --config=cuda`` of v2.14.1 compiles a file with
* ``build:linux --copt/--cxxopt`` of ``.bazelrc`` (warnings as errors for unused results and
  switches, ``-std=c++17``),
* ``tf_copts()`` (tensorflow.bzl) or ``tsl_copts()`` (tsl.bzl) of its target: ``-fno-exceptions``,
  ``-DGOOGLE_CUDA=1`` (if_cuda), ``-DTENSORFLOW_USE_XLA=1``, ``-msse3``, ``-pthread``, ...
* the ``defines`` its deps export (Eigen's ``EIGEN_MAX_ALIGN_BYTES=64``, ``EIGEN_MPL2_ONLY``),
* pybind extensions add ``-fno-strict-aliasing -fexceptions`` (pybind_extension_opensource),
* the toolchain's opt mode ``-O2 -DNDEBUG`` and ``-fPIC`` for the shared libraries,
* ``-D_GLIBCXX_USE_CXX11_ABI`` as the wheel was built (read from its symbols by the caller).

Invariant: every group is found in the tree or the check stops with the file and the anchor
that moved; flags are never silently dropped.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import LmsError

# What the configuration `--config=opt --config=cuda` (framework_shared_object, Linux x86-64,
# XLA available) selects in tf_copts()/tsl_copts(); the other if_* branches are off there.
SELECTED = ("if_not_windows", "if_cuda", "if_xla_available", "if_linux_x86_64")
TOOLCHAIN_OPT = ["-O2", "-DNDEBUG", "-g0", "-fPIC"]


def _strings(text: str) -> list[str]:
    return re.findall(r'"([^"]*)"', text)


def _def_body(path: Path, name: str) -> str:
    text = path.read_text()
    m = re.search(rf"^def {name}\(.*?(?=^def |\Z)", text, re.S | re.M)
    if not m:
        raise LmsError(f"{path}: def {name}( not found (the flag reader needs updating)")
    return m.group(0)


def bazelrc_linux(tree: Path) -> list[str]:
    """``build --copt/--cxxopt`` and ``build:linux --copt/--cxxopt`` of ``.bazelrc``, in order."""
    out = []
    for line in (tree / ".bazelrc").read_text().splitlines():
        m = re.match(r"build(?::linux)?\s+--(?:copt|cxxopt)[= ](\S+)\s*$", line.strip())
        if m:
            out.append(m.group(1).strip('"'))
    if "-std=c++17" not in out:
        raise LmsError(f"{tree / '.bazelrc'}: no build:linux --cxxopt=-std=c++17")
    return out


def rule_copts(tree: Path, bzl: str, name: str) -> list[str]:
    """The flags ``name()`` (tf_copts or tsl_copts) gives a Linux x86-64 CUDA build."""
    body = _def_body(tree / bzl, name)
    out: list[str] = []
    for fn in SELECTED:
        found = re.findall(rf"\b{fn}\(\s*\[(.*?)\]", body, re.S)
        if not found:
            raise LmsError(f"{tree / bzl}: {name}() has no {fn}([...]) (the flag reader needs updating)")
        for group in found:
            out += _strings(group)
    if '"//conditions:default": ["-pthread"]' not in body:
        raise LmsError(f"{tree / bzl}: {name}() no longer defaults to -pthread")
    out.append("-pthread")
    # Bazel runs compilations in the execution root, where external/<repo> is the repository:
    # the check maps such include flags to the wheel's copy (tensorflow/include/external/...).
    return out


def pybind_copts(tree: Path) -> list[str]:
    body = _def_body(tree / "tensorflow/tensorflow.bzl", "pybind_extension_opensource")
    m = re.search(r"copts = copts \+ \[(.*?)\]", body, re.S)
    if not m:
        raise LmsError("tensorflow.bzl: pybind_extension_opensource copts not found")
    return _strings(m.group(1))


def eigen_defines(tree: Path) -> list[str]:
    text = (tree / "third_party/eigen3/eigen_archive.BUILD").read_text()
    m = re.search(r"defines = \[(.*?)\]", text, re.S)
    if not m:
        raise LmsError("third_party/eigen3/eigen_archive.BUILD: defines not found")
    return ["-D" + d for d in _strings(m.group(1))]


def for_file(tree: Path, rel: str, cxx11_abi: bool) -> list[str]:
    """All flags for the patch file ``rel`` (tree-relative), in Bazel's order: toolchain,
    .bazelrc, the rule's copts, then the deps' defines."""
    if rel.startswith("tensorflow/tsl/"):
        rule = rule_copts(tree, "tensorflow/tsl/tsl.bzl", "tsl_copts")
    else:
        rule = rule_copts(tree, "tensorflow/tensorflow.bzl", "tf_copts")
    if rel == "tensorflow/python/tfe_wrapper.cc":
        rule += pybind_copts(tree)
    abi = "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(cxx11_abi)
    return [*TOOLCHAIN_OPT, *bazelrc_linux(tree), *rule, *eigen_defines(tree), abi]
