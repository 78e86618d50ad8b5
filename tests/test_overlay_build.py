"""The real overlay build: official torch 2.6.0 wheel + libc10_cuda.so rebuilt from the LMS tree
(lms_tree fixture: the Debian v2.6.0 tree with the current LMS sources composed on top)."""
from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path


from build_tools.abi import dynamic_section, dynamic_symbols
from build_tools.overlay.wheelzip import verify_record
from tests.overlay_fixtures import TAG, overlay_build  # noqa: F401  (fixture)


def _official(res) -> Path:
    rep = json.loads(res.report.read_text())
    from build_tools.wheels import DEFAULT_CACHE
    return DEFAULT_CACHE / rep["official_wheel"]


def test_wheel_name_version_and_report(overlay_build):
    res, tree = overlay_build
    assert res.version == "2.6.0+lms1"
    assert re.fullmatch(r"torch-2\.6\.0\+lms1-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64\.whl", res.wheel.name), res.wheel.name
    assert res.wheel.parent.name == "dist" and res.report.is_file()
    # nothing but the finished wheel and its report in dist/
    assert sorted(p.name for p in res.wheel.parent.iterdir()) == sorted([res.wheel.name, res.report.name])
    rep = json.loads(res.report.read_text())
    assert rep["abi"]["c10_cuda"]["ok"] is True
    assert rep["plan"]["rebuild"] == ["c10_cuda"]
    print("timings:", rep["timings_s"])


def test_record_hashes_and_metadata(overlay_build):
    res, _ = overlay_build
    n = verify_record(res.wheel)
    assert n > 10000
    with zipfile.ZipFile(res.wheel) as zf:
        names = zf.namelist()
        dist_infos = {x.split("/")[0] for x in names if ".dist-info/" in x}
        assert dist_infos == {"torch-2.6.0+lms1.dist-info"}
        meta = zf.read("torch-2.6.0+lms1.dist-info/METADATA").decode()
        assert re.search(r"^Version: 2\.6\.0\+lms1$", meta, re.M)
        vpy = zf.read("torch/version.py").decode()
        assert "__version__ = '2.6.0+lms1'" in vpy and "cuda: Optional[str] = '12.4'" in vpy
        wheel_file = zf.read("torch-2.6.0+lms1.dist-info/WHEEL").decode()
        plat = res.wheel.name[:-4].split("-")[-1]
        assert f"-{plat}" in wheel_file
        assert names[-1] == "torch-2.6.0+lms1.dist-info/RECORD"


def test_only_the_planned_members_changed(overlay_build):
    """Every member is byte-identical to the official wheel except: libc10_cuda.so, the patch's Python
    files and headers, version.py and the .dist-info files."""
    res, tree = overlay_build
    rep = json.loads(res.report.read_text())
    official = _official(res)
    with zipfile.ZipFile(official) as zo, zipfile.ZipFile(res.wheel) as zn:
        old = {i.filename: i for i in zo.infolist()}
        new = {i.filename: i for i in zn.infolist()}
        ren = lambda n: n.replace("torch-2.6.0.dist-info/", "torch-2.6.0+lms1.dist-info/")  # noqa: E731
        expected_changed = {"torch/lib/libc10_cuda.so", "torch/version.py"}
        expected_changed |= set(rep["plan"]["python_files"]) | {f"torch/include/{h}" for h in rep["plan"]["headers"]}
        expected_changed |= set((rep.get("net") or {}).get("members", ()))  # the eviction net, compiled
        changed, added = set(), set(new)
        for n, info in old.items():
            nn = ren(n)
            added.discard(nn)
            if n.endswith(("/RECORD", "/METADATA", "/WHEEL")) and ".dist-info/" in n:
                continue
            assert nn in new or n in {f"torch/include/{h}" for h in rep["plan"]["headers_deleted"]}, f"{n} missing"
            if nn in new and new[nn].CRC != info.CRC:
                changed.add(n)
        new_files = {n for n in added if not n.startswith("torch-2.6.0+lms1.dist-info/")}
        assert changed <= expected_changed, changed - expected_changed
        assert "torch/lib/libc10_cuda.so" in changed
        assert new_files <= expected_changed, new_files - expected_changed
        # the patch's Python files are in the wheel, byte for byte
        for f in rep["plan"]["python_files"]:
            assert zn.read(f) == (tree / f).read_bytes(), f


def test_rebuilt_library_matches_official_linkage(overlay_build, tmp_path):
    res, _ = overlay_build
    official = _official(res)
    for wheel, name in ((official, "old"), (res.wheel, "new")):
        with zipfile.ZipFile(wheel) as zf:
            (tmp_path / f"{name}.so").write_bytes(zf.read("torch/lib/libc10_cuda.so"))
    old, new = dynamic_section(tmp_path / "old.so"), dynamic_section(tmp_path / "new.so")
    assert new["soname"] == old["soname"] == "libc10_cuda.so"
    assert new["rpath"] == old["rpath"] and new["runpath"] is None
    assert set(new["needed"]) <= set(old["needed"])
    # every c10 symbol of the official library is still exported (the ABI check in miniature)
    o = {s for s in dynamic_symbols(tmp_path / "old.so", defined=True) if s.startswith("_ZN3c10") or s.startswith("_ZNK3c10")}
    n = set(dynamic_symbols(tmp_path / "new.so", defined=True))
    assert o and o <= n, sorted(o - n)[:10]
    # LMS entry points exist in the rebuilt library (the C API torch/cuda/lms.py calls)
    lms = sorted(s for s in n if "lms" in s.lower())
    assert lms, "no LMS symbols in the rebuilt libc10_cuda.so"
    # no debug info shipped (like the official library)
    sections = subprocess.run(["readelf", "-S", "-W", str(tmp_path / "new.so")], capture_output=True, text=True).stdout
    assert ".debug_info" not in sections


def test_abi_report_content(overlay_build):
    res, _ = overlay_build
    rep = json.loads(res.report.read_text())["abi"]["c10_cuda"]
    assert rep["ok"] and rep["problems"] == []
    # type check between the unpatched and patched rebuilds (with DWARF) ran: whatever it found
    # removed or changed is a std:: template instance, tolerated by name
    from build_tools.abi import is_std_symbol, is_toolchain_symbol
    t = rep["types"]
    std = [x for x in rep["tolerated"] if x["why"].startswith("type check: std::")]
    assert t["functions"]["removed"] + t["variables"]["removed"] + t["functions"]["changed"] \
        + t["variables"]["changed"] <= len(std), (t, std)
    # everything tolerated is a toolchain artefact or a std:: instance, with a reason
    assert all((is_toolchain_symbol(x["symbol"]) or is_std_symbol(x["symbol"])
                or x["symbol"].startswith(("std::", "__gnu_cxx::"))) and x["why"]
               for x in rep["tolerated"]), rep["tolerated"]
