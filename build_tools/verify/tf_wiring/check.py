"""The wiring check of one tree: compile, resolve symbols, check consistency (see build_tools/verify/tf_wiring)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import LmsError
from ..tf_release import REPO, tf_profile
from . import compile as cc
from . import consistency, symbols, wheel
from .wheel import DEFAULT_CACHE, log

__all__ = ["GENERATED", "GPU_DIR", "PATCH", "Report", "TAG", "WHEEL_CUDA", "check", "patch_files", "upstream_texts"]

TAG = tf_profile().tag  # the profile's tag (the newest supported TensorFlow tag)
PATCH = tf_profile().patch_file
GPU_DIR = "tensorflow/core/common_runtime/gpu/"
GENERATED = "tensorflow/core/protobuf/config.pb.cc"
WHEEL_CUDA = "cuda-11.8 (wheel)"


@dataclass
class Report:
    protoc: str = ""
    cuda_variants: dict[str, int] = field(default_factory=dict)
    units: list[cc.Unit] = field(default_factory=list)
    resolution: dict = field(default_factory=dict)
    replaced: int = -1  # wheel definitions the stock edited files made (-1: not checked)
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (section, path, message)
    seconds: float = 0.0

    def add(self, section: str, path: str, message: str) -> None:
        self.problems.append((section, path, message))

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        out = [f"TensorFlow {TAG} LMS wiring check: "
               + ("PASS" if self.ok else f"FAIL ({len(self.problems)} problem(s))")]
        exact = "exact" if self.protoc == cc.PROTOC_VERSION else f"NOT the pinned {cc.PROTOC_VERSION}"
        out.append(f"  protoc {self.protoc} ({exact}) regenerated config.pb.h/.cc")
        for name, v in self.cuda_variants.items():
            out.append(f"  CUDA headers {name}: CUDA_VERSION {v}")
        for u in self.units:
            state = "ok" if u.ok else "FAILED"
            took = f"{u.seconds:5.1f} s" if u.seconds else " cached"
            out.append(f"  compile [{u.variant}] {u.rel}: {state} ({took})")
        r = self.resolution
        if self.replaced >= 0:
            out.append(f"  {self.replaced} definitions of the stock edited files taken out of the wheel's symbols")
        else:
            out.append("  NOTE: no upstream tree: the wheel's stock definitions of edited files count as found")
        if r:
            origin = ", ".join(f"{k}: {v}" for k, v in sorted(r["from"].items()))
            out.append(f"  symbols: {r['needed']} undefined references, "
                       f"{sum(len(v) for v in r['unresolved'].values())} unresolved ({origin})")
        for section, path, msg in self.problems:
            out.append(f"  PROBLEM [{section}] {path}: {msg}")
        out.append(f"  took {self.seconds:.0f} s")
        return "\n".join(out)


def patch_files(patch_text: str) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", patch_text, re.M)


def upstream_texts(tree: Path, upstream: Path | None, rels: list[str]) -> dict[str, str] | None:
    """The stock text of each of ``rels``: from ``upstream`` (a v2.14.1 tree), else from the tag
    in the tree's own git history; None when neither is there."""
    out = {}
    for rel in rels:
        if upstream is not None:
            if (upstream / rel).exists():
                out[rel] = (upstream / rel).read_text()
            continue
        r = subprocess.run(["git", "-C", str(tree), "show", f"{TAG}:{rel}"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        if r.returncode != 0:
            return None
        out[rel] = r.stdout
    return out


def check(tree: Path, out: Path | None = None, cache: Path = DEFAULT_CACHE,
          patch: Path = PATCH, jobs: int | None = None, other_cuda: bool = True,
          upstream: Path | None = None) -> Report:
    """Runs all checks on ``tree`` (a v2.14.1 tree with the LMS change applied); ``upstream``
    is the stock v2.14.1 tree (default: the tag in ``tree``'s git history, if it has one)."""
    t0 = time.monotonic()
    tree = tree.resolve()
    out = (out or REPO / "build" / "tf_wiring").resolve()
    report = Report()
    patch_text = patch.read_text()
    files = patch_files(patch_text)
    sources = [f for f in files if f.endswith(".cc")]
    headers = [f for f in files if f.endswith(".h")]

    wheel_dir = wheel.ensure(cache)
    include = wheel_dir / "tensorflow" / "include"
    report.cuda_variants[WHEEL_CUDA] = wheel.cuda_version(include / cc.CUDA_INCLUDE)
    # a variant's CUDA headers: the folder with cuda.h, then any more (CUDA 12's wheels keep
    # crt/ in another one); None: the wheel's own
    variants: dict[str, list[Path] | None] = {WHEEL_CUDA: None}
    if other_cuda:
        # CUDA 12 (setup's 12.4 wheels) stands for the 12.x a TensorFlow build pins, whose
        # driver API lacks what 13 added; CUDA 13 for what the GPU machine builds with
        from ... import cuda_headers
        for major in (12, 13):
            found = cuda_headers.find(major)
            if found is None:
                raise LmsError(f"no CUDA {major} headers: `make setup` installs NVIDIA's "
                                 "header wheels")
            variants[f"cuda-{major}"] = list(found.includes)
            report.cuda_variants[f"cuda-{major}"] = wheel.cuda_version(found.home / "include")

    try:
        gen, report.protoc = cc.regenerate_config_proto(tree, out / "gen")
    except cc.CompileError as e:
        report.add("protoc", e.rel, "\n    ".join(e.lines[:10]))
        report.seconds = time.monotonic() - t0
        return report
    overlay = out / "overlay"
    cc.make_overlay(tree, sources + headers, overlay)
    abi = wheel.uses_cxx11_abi(wheel_dir)
    prefixes = {str(overlay) + "/": "", str(gen) + "/": "", str(tree) + "/": ""}

    units: list[cc.Unit] = []
    for variant, cuda_inc in variants.items():
        incs = cc.include_flags(gen, overlay, include, tree, cuda_inc)
        tag = "wheel" if cuda_inc is None else variant
        todo = [(rel, overlay / rel) for rel in sources]
        if cuda_inc is None:
            todo.append((GENERATED, gen / GENERATED))
        else:
            todo = [t for t in todo if t[0].startswith(GPU_DIR)]
        for rel, src in todo:
            obj = out / "obj" / tag / (rel.replace("/", "__") + ".o")
            cmd = cc.command(os.environ.get("CXX", "g++"), tree, rel, src, obj, incs, abi, include)
            units.append(cc.Unit(rel, variant, src, obj, cmd))
    # The stock versions of the edited library sources (new files have none; the pybind module
    # exports nothing another object links to), with the stock versions of the patch's headers
    # and the wheel's own config.pb.h.
    added = set(consistency.new_files(patch_text))
    edited = [f for f in sources if f not in added and not f.endswith("tfe_wrapper.cc")]
    stock = upstream_texts(tree, upstream.resolve() if upstream else None,
                           edited + [h for h in headers if h not in added])
    stock_units: list[cc.Unit] = []
    if stock is not None:
        stock_overlay = out / "stock-overlay"
        if stock_overlay.exists():
            shutil.rmtree(stock_overlay)
        for rel, text in stock.items():
            (stock_overlay / rel).parent.mkdir(parents=True, exist_ok=True)
            (stock_overlay / rel).write_text(text)
        incs = [f"-I{stock_overlay}"] + cc.include_flags(out / "no-gen", stock_overlay, include,
                                                          tree, None)[2:]
        prefixes[str(stock_overlay) + "/"] = "(stock) "
        for rel in edited:
            obj = out / "obj" / "stock" / (rel.replace("/", "__") + ".o")
            cmd = cc.command(os.environ.get("CXX", "g++"), tree, rel, stock_overlay / rel, obj,
                             incs, abi, include)
            stock_units.append(cc.Unit(rel, "stock", stock_overlay / rel, obj, cmd))
        units += stock_units
    inputs = [overlay / h for h in headers] + [gen / "tensorflow/core/protobuf/config.pb.h"]
    log(f"compiling {len(units)} object files (-j{jobs or 2}) into {out / 'obj'}")
    cc.compile_units(units, inputs, prefixes, tree, jobs or 2)
    report.units = units
    for u in units:
        if not u.ok:
            report.add("compile", u.rel, f"[{u.variant}]\n    " + "\n    ".join(u.errors[:12]))

    if all(u.ok for u in units):
        providers = wheel.wheel_symbols(wheel_dir)
        if stock is not None:
            gone = set().union(*(symbols.strong_defined(u.obj) for u in stock_units)) if stock_units else set()
            report.replaced = len(gone)
            providers = {lib: syms - gone for lib, syms in providers.items()}
        providers.update(symbols.system_symbols(include / cc.PYTHON_INCLUDE))
        objects = {u.obj: u.rel for u in units if u not in stock_units}
        report.resolution = symbols.resolve(objects, providers)
        for rel, missing in report.resolution["unresolved"].items():
            for name in missing:
                report.add("link", rel, f"undefined symbol {name}")
        for name, rels in report.resolution["duplicates"].items():
            report.add("link", rels[0], f"{name} also defined by {', '.join(rels[1:])}")

    for h in headers:
        if not any(f'#include "{h}"' in (tree / f).read_text() for f in sources + headers):
            report.add("headers", h, "no file of the patch includes it, so nothing compiled it")
    for path, msg in consistency.check_build(tree, patch_text, include):
        report.add("BUILD", path, msg)
    for path, msg in consistency.check_golden(tree):
        report.add("API golden", path, msg)
    for path, msg in consistency.check_pybind(tree):
        report.add("pybind", path, msg)
    report.seconds = time.monotonic() - t0
    return report
