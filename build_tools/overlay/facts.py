"""Build facts of an official torch wheel, read from the wheel's files (torch is never imported).

  torch/version.py                      __version__, cuda (e.g. '12.4'), git_version
  <dist-info>/METADATA, WHEEL           version, Requires-Dist (nvidia-* pins), wheel tag
  torch/share/cmake/Torch/TorchConfig.cmake   `-D_GLIBCXX_USE_CXX11_ABI=N` it asks consumers to use
  torch/lib/libc10.so dynamic symbols   cross-check of that flag ([abi:cxx11] names exist iff ABI=1)
  torch/lib/libc10_cuda.so              NEEDED, SONAME, RPATH, symbol versions, compiler (.comment)
  torch/lib/libtorch_cpu.so             the CXX_FLAGS string of `torch.__config__.show()` (read as bytes)
  torch/include/c10/macros/cmake_macros.h   the generated c10 configuration
Results are cached as JSON beside the wheel (`<wheel>.facts.json`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..abi import dynamic_section, dynamic_symbols, required_versions
from ..errors import LmsError

FACTS_FORMAT = 3

# Flags of the official build that change generated code or symbol names/visibility; the overlay
# compiles with these (warnings and feature -D's of other libraries are left out).
_ABI_FLAG = re.compile(r"^(-D_GLIBCXX_USE_CXX11_ABI=\d|-fabi-version=\d+|-fvisibility-inlines-hidden|"
                       r"-fno-math-errno|-fno-trapping-math|-faligned-new|-DNDEBUG|-O[0-3s])$")


@dataclasses.dataclass
class WheelFacts:
    wheel: str
    dist_info: str                # e.g. torch-2.6.0.dist-info
    version: str                  # METADATA Version (2.6.0)
    torch_version: str            # torch/version.py __version__ (2.6.0+cu124)
    cuda: str | None              # torch/version.py cuda (12.4)
    git_version: str | None
    wheel_tags: list              # from WHEEL
    requires_dist: list
    cxx11_abi: int                # 0 / 1
    cxx11_abi_evidence: dict
    cxx_flags: list               # full CXX_FLAGS string of the build, split
    abi_flags: list               # the subset the overlay compiles with
    c10_cuda: dict                # needed / soname / rpath / runpath / versions / comment
    cmake_macros: dict            # name -> defined (bool)
    consumers: dict               # lib -> {"needed": [...], "imports_from_c10_cuda": [...]}
    exports: dict                 # lib -> the symbols it exports that consumers import from libc10_cuda
    format: int = FACTS_FORMAT

    @property
    def nvidia_requirements(self) -> list[str]:
        return [r.split(";")[0].strip() for r in self.requires_dist if r.lower().startswith("nvidia-")]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _dist_info(zf: zipfile.ZipFile) -> str:
    names = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")}
    if len(names) != 1:
        raise LmsError(f"{zf.filename}: expected one .dist-info folder, found {sorted(names)}")
    return names.pop()


def _pyassign(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.M)
    if not m:
        return None
    return m.group(1) if m.group(1) is not None else m.group(2)


def _scan_flags(zf: zipfile.ZipFile, member: str) -> str | None:
    """Find the CXX_FLAGS string in a (large) library without unpacking it to disk."""
    pat = re.compile(rb"[ ]?-D_GLIBCXX_USE_CXX11_ABI=[01][ -~]{20,4000}")
    tail = b""
    with zf.open(member) as fh:
        while True:
            chunk = fh.read(16 << 20)
            if not chunk:
                return None
            buf = tail + chunk
            m = pat.search(buf)
            if m and m.end() < len(buf):
                return m.group(0).decode().strip()
            tail = buf[-8192:]


def read_facts(wheel: Path, *, use_cache: bool = True, progress=print) -> WheelFacts:
    wheel = Path(wheel)
    cache = wheel.with_name(wheel.name + ".facts.json")
    if use_cache and cache.is_file() and cache.stat().st_mtime >= wheel.stat().st_mtime:
        data = json.loads(cache.read_text())
        if data.get("format") == FACTS_FORMAT and data.get("wheel") == wheel.name:
            return WheelFacts(**data)
    progress(f"  reading build facts from {wheel.name} ...")
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="lms-facts-") as tmp:
        names = set(zf.namelist())
        di = _dist_info(zf)
        need = ["torch/version.py", f"{di}/METADATA", f"{di}/WHEEL", "torch/lib/libc10.so",
                "torch/lib/libc10_cuda.so", "torch/share/cmake/Torch/TorchConfig.cmake",
                "torch/include/c10/macros/cmake_macros.h"]
        missing = [n for n in need if n not in names]
        if missing:
            raise LmsError(f"{wheel.name} is not a CUDA torch wheel the overlay build understands: "
                           f"missing {', '.join(missing)}")
        vpy = zf.read("torch/version.py").decode()
        meta = zf.read(f"{di}/METADATA").decode()
        whl = zf.read(f"{di}/WHEEL").decode()
        tcfg = zf.read("torch/share/cmake/Torch/TorchConfig.cmake").decode()
        macros_h = zf.read("torch/include/c10/macros/cmake_macros.h").decode()
        t = Path(tmp)
        zf.extract("torch/lib/libc10.so", t)
        zf.extract("torch/lib/libc10_cuda.so", t)
        flags_str = _scan_flags(zf, "torch/lib/libtorch_cpu.so") if "torch/lib/libtorch_cpu.so" in names else None

        # Which libraries of the wheel load libc10_cuda.so, what they import from it, and what the
        # libraries in their NEEDED closure export (for the removed-symbol rule of the ABI check).
        libs = sorted(n for n in names if re.fullmatch(r"torch/lib/lib[^/]+\.so(\.[0-9]+)*|torch/_C\.[^/]+\.so|"
                                                        r"functorch/_C\.[^/]+\.so", n))
        dyn: dict[str, dict] = {}
        imports: dict[str, dict] = {}
        exports: dict[str, list] = {}
        for n in libs:
            info = zf.getinfo(n)
            p = zf.extract(n, t)
            d = dynamic_section(Path(p))
            dyn[n] = d
            if "libc10_cuda.so" in d["needed"] or n.endswith("libc10_cuda.so"):
                imports[n] = dynamic_symbols(Path(p), defined=False)
            exports[n] = sorted(dynamic_symbols(Path(p), defined=True))
            if info.file_size > (64 << 20):
                Path(p).unlink()
        c10cuda_exports = set(exports.get("torch/lib/libc10_cuda.so", []))
        consumers = {}
        by_soname = {Path(n).name: n for n in libs}
        for n, imp in imports.items():
            if n.endswith("libc10_cuda.so"):
                continue
            closure, todo = set(), list(dyn[n]["needed"])
            while todo:
                s = todo.pop()
                if s in closure or s not in by_soname:
                    continue
                closure.add(s)
                todo.extend(dyn[by_soname[s]]["needed"])
            consumers[n] = {"needed_closure": sorted(closure),
                            "imports_from_c10_cuda": sorted(s for s in imp if s in c10cuda_exports)}
        keep = {by_soname[s] for c in consumers.values() for s in c["needed_closure"] if s in by_soname}
        # only what matters for the ABI check: which of the symbols the consumers take from
        # libc10_cuda.so the other libraries in their closure also export
        relevant = {s for c in consumers.values() for s in c["imports_from_c10_cuda"]}
        exports = {k: sorted(set(v) & relevant) for k, v in exports.items() if k in keep}

        c10 = t / "torch/lib/libc10.so"
        c10_exports = dynamic_symbols(c10, defined=True)
        cxx11_syms = sum(1 for s in c10_exports if "B5cxx11" in s)
        m = re.search(r"-D_GLIBCXX_USE_CXX11_ABI=([01])", tcfg)
        cfg_abi = int(m.group(1)) if m else None
        flag_abi = None
        if flags_str:
            m = re.search(r"-D_GLIBCXX_USE_CXX11_ABI=([01])", flags_str)
            flag_abi = int(m.group(1)) if m else None
        sym_abi = 1 if cxx11_syms else 0
        votes = {v for v in (cfg_abi, flag_abi, sym_abi) if v is not None}
        if len(votes) != 1:
            raise LmsError(f"{wheel.name}: contradictory CXX11 ABI evidence: TorchConfig.cmake={cfg_abi}, "
                           f"CXX_FLAGS={flag_abi}, libc10.so [abi:cxx11] symbols={cxx11_syms}")
        cc = t / "torch/lib/libc10_cuda.so"
        comment = subprocess.run(["readelf", "-p", ".comment", str(cc)], stdout=subprocess.PIPE,
                                 text=True).stdout
        c10_cuda = {**dynamic_section(cc), "versions": required_versions(cc),
                    "comment": sorted(set(re.findall(r"\]\s+(.+)$", comment, re.M))),
                    "has_symtab": ".symtab" in subprocess.run(["readelf", "-S", "-W", str(cc)],
                                                              stdout=subprocess.PIPE, text=True).stdout}
    cxx_flags = shlex.split(flags_str) if flags_str else [f"-D_GLIBCXX_USE_CXX11_ABI={votes.copy().pop()}"]
    facts = WheelFacts(
        wheel=wheel.name, dist_info=di,
        version=re.search(r"^Version: (.+)$", meta, re.M).group(1).strip(),
        torch_version=_pyassign(vpy, "__version__") or "",
        cuda=_pyassign(vpy, "cuda"), git_version=_pyassign(vpy, "git_version"),
        wheel_tags=re.findall(r"^Tag: (.+)$", whl, re.M),
        requires_dist=[r.strip() for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)],
        cxx11_abi=votes.pop(),
        cxx11_abi_evidence={"TorchConfig.cmake": cfg_abi, "CXX_FLAGS": flag_abi,
                            "libc10.so_cxx11_symbols": cxx11_syms},
        cxx_flags=cxx_flags, abi_flags=[f for f in cxx_flags if _ABI_FLAG.match(f)],
        c10_cuda=c10_cuda,
        cmake_macros={m.group(2): m.group(1) == "#define"
                      for m in re.finditer(r"^(#define|/\* #undef) (\w+)", macros_h, re.M)},
        consumers=consumers, exports=exports)
    try:
        cache.write_text(json.dumps(facts.to_json(), indent=1) + "\n")
    except OSError:
        pass
    return facts
