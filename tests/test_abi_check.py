"""ABI check (build_tools.abi) on tiny real shared libraries compiled here with gcc/g++ and compared
by the real abidiff: additions pass; a removed function, a changed struct layout and a changed
signature fail; the toolchain-artefact rule needs both the baseline and a provider."""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from build_tools.abi import (BIT_ABI_CHANGE, BIT_ERROR, BIT_INCOMPATIBLE, BIT_USAGE_ERROR,
                             check_library, is_toolchain_symbol, only_grows_problems, run_abidiff)
from build_tools.tools import find_tool

BASE_C = """
struct S { int a; };
int f(struct S *s) { return s->a; }
int g(void) { return 1; }
"""


def so(tmp: Path, name: str, src: str, *, cxx: bool = False, debug: bool = True) -> Path:
    ext = ".cpp" if cxx else ".c"
    (tmp / (name + ext)).write_text(textwrap.dedent(src))
    out = tmp / f"lib{name}.so"
    cmd = ["g++" if cxx else "gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(tmp / (name + ext))]
    if debug:
        cmd.insert(1, "-g")
    subprocess.run(cmd, check=True)
    return out


def test_abidiff_is_installed():
    assert find_tool("abidiff"), "abidiff missing: apt-get install abigail-tools (make setup does)"


def test_additions_only_pass(tmp_path):
    v1 = so(tmp_path, "v1", BASE_C)
    v2 = so(tmp_path, "v2", BASE_C + "int h(void) { return 2; }\nint counter = 3;\n")
    d = run_abidiff(v1, v2)
    assert d.exit_code & BIT_ABI_CHANGE and not d.exit_code & BIT_INCOMPATIBLE
    assert d.functions == {"removed": 0, "changed": 0, "added": 1}
    assert d.variables["added"] == 1
    rep = check_library(v1, v2)
    assert rep.ok, rep.problems
    assert set(rep.added) == {"h", "counter"}


def test_removed_function_fails(tmp_path):
    v1 = so(tmp_path, "v1", BASE_C)
    v2 = so(tmp_path, "v2", "struct S { int a; };\nint f(struct S *s) { return s->a; }\n")
    d = run_abidiff(v1, v2)
    assert d.exit_code & BIT_INCOMPATIBLE
    assert d.removed_symbols == ["g"]
    rep = check_library(v1, v2)
    assert not rep.ok
    assert any("removed symbol g" in p for p in rep.problems)


def test_struct_layout_change_fails(tmp_path):
    v1 = so(tmp_path, "v1", BASE_C)
    v2 = so(tmp_path, "v2", BASE_C.replace("struct S { int a; };", "struct S { long x; int a; };"))
    d = run_abidiff(v1, v2)
    assert d.exit_code & BIT_ABI_CHANGE
    assert d.functions["changed"] == 1
    rep = check_library(v1, v2)
    assert not rep.ok and "changed" in rep.problems[0]
    # the exit status alone does not show it: only bit 4 is set, as for additions, so a check that
    # masks bits 1, 2 and 8 passes a layout change; only_grows_problems reads the report
    assert d.exit_code & (BIT_ERROR | BIT_USAGE_ERROR | BIT_INCOMPATIBLE) == 0, d.exit_code
    problems = only_grows_problems(d)
    assert any("1 functions/variables changed" in p and "f(S*)" in p for p in problems), problems


def test_only_grows_allows_additions_and_nothing_else(tmp_path):
    """The rule of test_c10_cuda_abi_only_grows: added functions, variables and symbols pass;
    a removed or changed function, a changed variable type or a tool failure fails."""
    v1 = so(tmp_path, "v1", BASE_C + "long counter = 3;\n")
    grown = so(tmp_path, "grown", BASE_C + "long counter = 3;\nint h(void) { return 2; }\nint extra = 1;\n")
    assert only_grows_problems(run_abidiff(v1, grown)) == []
    removed = so(tmp_path, "removed", BASE_C.replace("int g(void) { return 1; }", "") + "long counter = 3;\n")
    assert any("1 functions/variables/symbols removed: g" in p for p in only_grows_problems(run_abidiff(v1, removed)))
    var_type = so(tmp_path, "var_type", BASE_C + "int counter = 3;\n")
    assert any("1 functions/variables changed" in p and "counter" in p
               for p in only_grows_problems(run_abidiff(v1, var_type)))
    bogus = tmp_path / "not-elf.so"
    bogus.write_text("hello")
    assert any("abidiff failed" in p for p in only_grows_problems(run_abidiff(v1, bogus)))


def test_summary_with_suppressions_is_parsed():
    """With --suppressions (test_c10_cuda_abi_only_grows) abidiff writes "(N filtered out)" after
    a count; a changed function must still be counted there, not read as 0."""
    from build_tools.abi import Abidiff, parse_report
    report = ("Functions changes summary: 0 Removed (1 filtered out), 2 Changed (30 filtered out), "
              "62 Added (13 filtered out) functions\n"
              "Variables changes summary: 0 Removed, 0 Changed, 0 Added variable\n"
              "Function symbols changes summary: 1 Removed (3 filtered out), 0 Added (3 filtered out) "
              "function symbols not referenced by debug info\n"
              "Variable symbols changes summary: 0 Removed, 4 Added (3 filtered out) variable symbols "
              "not referenced by debug info\n")
    p = parse_report(report)
    assert p["functions"] == {"removed": 0, "changed": 2, "added": 62}
    assert p["function_symbols"] == {"removed": 1, "added": 0}
    assert p["variable_symbols"] == {"removed": 0, "added": 4}
    d = Abidiff(old="a", new="b", exit_code=BIT_ABI_CHANGE, report=report, **p)
    problems = only_grows_problems(d)
    assert any("2 functions/variables changed: (entries not parsed)" in x for x in problems), problems
    assert any("1 functions/variables/symbols removed" in x for x in problems), problems


def test_cxx_class_layout_change_caught_by_type_check(tmp_path):
    """What the overlay does for libc10_cuda: the official binary has no DWARF, so the layout check
    compares unpatched vs patched rebuilds with -g (types_old/types_new)."""
    src = """
    namespace c10 { struct __attribute__((visibility("default"))) Stats {
      long allocated; long reserved;
      long total() const; };
    long Stats::total() const { return allocated + reserved; } }
    """
    old_dbg = so(tmp_path, "old", src, cxx=True)
    new_dbg = so(tmp_path, "new", src.replace("long allocated;", "long allocated; long swapped;"), cxx=True)
    old_nodbg = so(tmp_path, "old_nodbg", src, cxx=True, debug=False)
    new_nodbg = so(tmp_path, "new_nodbg", src.replace("long allocated;", "long allocated; long swapped;"),
                   cxx=True, debug=False)
    # symbol tables alone cannot see it ...
    assert check_library(old_nodbg, new_nodbg).ok
    # ... the debug-info comparison does
    rep = check_library(old_nodbg, new_nodbg, types_old=old_dbg, types_new=new_dbg)
    assert not rep.ok
    assert any("type check" in p for p in rep.problems), rep.problems
    assert any("type check" in p and "1 functions/variables changed" in p and "Stats::total" in p
               for p in rep.problems), rep.problems


def test_layout_change_reached_through_a_std_container_fails(tmp_path):
    """A c10 class whose member is a std::vector of a struct that grew: abidiff reports the c10
    method as changed through std:: types (with the c10 build's std:: suppressions it reports
    nothing at all). Only std:: instances themselves are tolerated, so this fails."""
    src = """
    #include <vector>
    namespace c10 { struct Info { long a; int b; };
    struct __attribute__((visibility("default"))) Registry {
      std::vector<Info> launches; Registry(); long n() const; };
    Registry::Registry() : launches(4) {}
    long Registry::n() const { return (long)launches.size(); } }
    """
    old = so(tmp_path, "old", src, cxx=True)
    new = so(tmp_path, "new", src.replace("long a; int b;", "long a; long extra; int b;"), cxx=True)
    d = run_abidiff(old, new)
    assert d.exit_code & (BIT_ERROR | BIT_USAGE_ERROR | BIT_INCOMPATIBLE) == 0, d.report
    problems = only_grows_problems(d)
    assert any("changed" in p and "c10::Registry" in p for p in problems), (problems, d.report)


def test_std_entries_are_told_from_the_library_s_own():
    from build_tools.abi import entry_name, is_std_entry
    std = ("[C] 'method void std::_Deque_base<long int, std::allocator<long int> >::_M_initialize_map"
           "(std::size_t)' has some indirect sub-type changes:")
    own = "[C] 'method c10::cuda::CUDAKernelLaunchRegistry::CUDAKernelLaunchRegistry()' has some indirect sub-type changes:"
    fn = "[C] 'function std::vector<int> c10::cuda::snapshot(const std::vector<int>&)' has some sub-type changes:"
    assert entry_name(std) == "std::_Deque_base<long int, std::allocator<long int> >::_M_initialize_map"
    assert is_std_entry(std)
    assert entry_name(own) == "c10::cuda::CUDAKernelLaunchRegistry::CUDAKernelLaunchRegistry"
    assert not is_std_entry(own)
    assert entry_name(fn) == "c10::cuda::snapshot" and not is_std_entry(fn)


def test_signature_change_fails(tmp_path):
    v1 = so(tmp_path, "v1", "namespace c10 { int set_limit(long v) { return (int)v; } }", cxx=True, debug=False)
    v2 = so(tmp_path, "v2", "namespace c10 { int set_limit(long v, bool f) { return f ? 0 : (int)v; } }",
            cxx=True, debug=False)
    rep = check_library(v1, v2)
    assert not rep.ok
    assert any("_ZN3c109set_limitEl" in p for p in rep.problems)
    assert "_ZN3c109set_limitElb" in rep.added


def test_toolchain_artefact_rule(tmp_path):
    """A removed std:: template instance is tolerated only if the unpatched rebuild lost it too and
    every library of the wheel that imports it still finds it elsewhere. (Here the std:: copies are
    dropped with a linker version script: the same effect as a different compiler not emitting them.)"""
    src = """
    #include <string>
    #include <vector>
    __attribute__((visibility("default"))) std::vector<std::string> names() { return {"a", "b"}; }
    __attribute__((visibility("default"))) int lms_api() { return 1; }
    """
    names = "_Z5namesB5cxx11v"
    vs_ok = tmp_path / "ok.map"
    vs_ok.write_text(f"{{ global: {names}; _Z7lms_apiv; local: *; }};\n")
    vs_bad = tmp_path / "bad.map"
    vs_bad.write_text(f"{{ global: {names}; local: *; }};\n")

    def lib(name, script=None):
        (tmp_path / "src.cpp").write_text(textwrap.dedent(src))
        out = tmp_path / f"lib{name}.so"
        cmd = ["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(tmp_path / "src.cpp")]
        if script:
            cmd.append(f"-Wl,--version-script={script}")
        subprocess.run(cmd, check=True)
        return out

    official = lib("official")
    rebuilt = lib("rebuilt", vs_ok)          # the overlay's rebuild: std:: copies no longer exported
    baseline_same = lib("baseline", vs_ok)   # the unpatched tree rebuilt with the same toolchain
    baseline_full = lib("baseline_full")     # ... a toolchain that still exports them
    removed = set(run_abidiff(official, rebuilt).removed_symbols)
    assert removed and all(is_toolchain_symbol(s) for s in removed), removed
    std = sorted(removed)

    # the unpatched rebuild still exports them, so the patch must have dropped them -> fails
    rep = check_library(official, rebuilt, baseline=baseline_full)
    assert not rep.ok and any("unpatched rebuild still has it" in p for p in rep.problems)
    # lost in the baseline too, imported by nobody -> tolerated
    rep = check_library(official, rebuilt, baseline=baseline_same)
    assert rep.ok, rep.problems
    assert {t["symbol"] for t in rep.tolerated} == removed
    # an importer that finds one nowhere else -> fails; with a provider -> tolerated
    rep = check_library(official, rebuilt, baseline=baseline_same,
                        importers={"libconsumer.so": {std[0]}}, providers={"libconsumer.so": set()})
    assert not rep.ok and any("imported by libconsumer.so" in p for p in rep.problems)
    rep = check_library(official, rebuilt, baseline=baseline_same,
                        importers={"libconsumer.so": {std[0]}}, providers={"libconsumer.so": {std[0]}})
    assert rep.ok
    rep = check_library(official, rebuilt, baseline=baseline_same, importers={"libconsumer.so": {std[0]}},
                        providers={"libconsumer.so": set()}, system_provided={std[0]})
    assert rep.ok
    # a non-toolchain symbol (our own API) removed is never tolerated, baseline or not
    rebuilt_bad = lib("rebuilt_bad", vs_bad)
    rep = check_library(official, rebuilt_bad, baseline=baseline_same)
    assert not rep.ok and any("removed symbol _Z7lms_apiv" in p for p in rep.problems)


def test_abidiff_tool_failure_is_a_failure(tmp_path):
    bogus = tmp_path / "not-elf.so"
    bogus.write_text("hello")
    v1 = so(tmp_path, "v1", BASE_C)
    rep = check_library(v1, bogus)
    assert not rep.ok
    assert "failed" in rep.problems[0]


def test_cli(tmp_path):
    import sys
    v1 = so(tmp_path, "v1", BASE_C)
    v2 = so(tmp_path, "v2", BASE_C + "int h(void) { return 2; }\n")
    v3 = so(tmp_path, "v3", "struct S { int a; };\nint f(struct S *s) { return s->a; }\n")
    repo = Path(__file__).resolve().parent.parent
    ok = subprocess.run([sys.executable, "-m", "build_tools.abi", str(v1), str(v2)], cwd=repo,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "build_tools.abi", str(v1), str(v3)], cwd=repo,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "removed symbol g" in bad.stdout
