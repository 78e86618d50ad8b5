"""ABI check of a rebuilt shared library against the official one (libabigail's `abidiff`).

The overlay build (build_tools/overlay) swaps `torch/lib/libc10_cuda.so` of an official wheel for one
compiled from the patched tree. That is only safe when every other library of the wheel still finds
what it was linked against. This module decides that, from abidiff's exit status and report:

Exit status of abidiff is a bit field (libabigail's `abidiff_status`):
  1 ABIDIFF_ERROR, 2 ABIDIFF_USAGE_ERROR: the tool failed -> the check fails (nothing was verified);
  4 ABIDIFF_ABI_CHANGE: something changed (additions alone set it too);
  8 ABIDIFF_ABI_INCOMPATIBLE_CHANGE: something was removed / changed incompatibly.
Bits tell *that* something changed; the report says *what*, so both are parsed (:class:`Abidiff`).

Policy (:func:`check_library`): only additions are allowed.
  * Functions / variables described by debug info: 0 removed, 0 changed (any type or layout change of
    a parameter, return value or variable - abidiff's "Changed" - fails).
  * ELF symbols not described by debug info (the official wheel has no DWARF, so for it abidiff can
    only compare symbol tables): 0 removed, except *toolchain artefacts*: vague-linkage copies of
    libstdc++ templates (namespace std / __gnu_cxx), C++ runtime entry points (operator new/delete,
    __cxa_*), `_init`/`_fini` - symbols that a different compiler version emits or omits for the SAME
    source. A toolchain artefact is tolerated only when
      (a) it is also missing from a rebuild of the UNPATCHED tree with the same toolchain (`baseline`),
          i.e. the patch did not cause it, and
      (b) no other library of the wheel imports it, or each importer still finds it in its own
          NEEDED closure inside the wheel or in the system libstdc++ that the wheel's platform tag
          guarantees (`providers`).
    Any other removal (a c10 symbol, a C symbol, ...) fails.
  * Types: a second abidiff between the unpatched and the patched rebuild, both with -g, compares
    class layouts and signatures of everything exported (the official binary has no DWARF, so this
    is the only way layouts can be checked): 0 removed, 0 changed.

CLI: ``python -m build_tools.abi OLD.so NEW.so [--baseline PRISTINE.so] [--types-old A.so --types-new B.so]``.

abidiff.py  running abidiff, its exit bits and report (Abidiff)
symbols.py  which symbols are the compiler's and C++ library's (toolchain artefacts, std:: instances)
elf.py      NEEDED / SONAME / RPATH, dynamic symbols and required symbol versions (readelf)
check.py    the decision (check_library -> AbiReport) and the growth rule
"""
from .abidiff import (BIT_ABI_CHANGE, BIT_ERROR, BIT_INCOMPATIBLE, BIT_USAGE_ERROR, AbiError, Abidiff,
                      parse_report, require_abidiff, run_abidiff)
from .check import AbiReport, check_library, growth_problems, only_grows_problems, write_report
from .elf import dynamic_section, dynamic_symbols, required_versions
from .symbols import entry_name, is_std_entry, is_std_symbol, is_toolchain_symbol

__all__ = ["AbiError", "AbiReport", "Abidiff", "BIT_ABI_CHANGE", "BIT_ERROR", "BIT_INCOMPATIBLE", "BIT_USAGE_ERROR",
           "check_library", "dynamic_section", "dynamic_symbols", "entry_name", "growth_problems", "is_std_entry",
           "is_std_symbol", "is_toolchain_symbol", "only_grows_problems", "parse_report", "required_versions",
           "require_abidiff", "run_abidiff", "write_report"]
