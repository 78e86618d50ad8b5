"""Which symbols and report entries belong to the compiler and C++ library rather than to the source:
what a rebuild with another compiler version may add or drop (see build_tools/abi/__init__.py)."""
from __future__ import annotations

import re

__all__ = ["entry_name", "is_std_entry", "is_std_symbol", "is_toolchain_symbol"]

# Symbols a compiler/libstdc++ version change may add or drop for identical sources (see module doc).
_TOOLCHAIN = re.compile(
    r"^(_ZN?K?St|_ZNSt|_ZNKSt|_ZSt|_ZN9__gnu_cxx|_ZNK9__gnu_cxx|_ZTVNSt|_ZTINSt|_ZTSNSt|_ZTVSt|_ZTISt|"
    r"_ZTSSt|_ZTVN9__gnu_cxx|_ZTIN9__gnu_cxx|_ZTSN9__gnu_cxx|_ZGVZNSt|_ZGVNSt|_Znw|_Zna|_Zdl|_Zda|"
    r"__cxa_|__gxx_|_init$|_fini$)")


def is_toolchain_symbol(sym: str) -> bool:
    return bool(_TOOLCHAIN.match(sym))


# std:: / __gnu_cxx template instances (vague linkage; also their guard variables, local statics)
_STD_SYMBOL = re.compile(r"^_Z(Z|GV|GVZ|T[VIS])?N?K?(St|9__gnu_cxx)")


def is_std_symbol(sym: str) -> bool:
    return bool(_STD_SYMBOL.match(sym)) or is_toolchain_symbol(sym)


def entry_name(entry: str) -> str:
    """Qualified name of the function or variable of a report entry
    (`[C] 'method void std::deque<long>::f(int)' has ...` -> `std::deque<long>::f`)."""
    m = re.search(r"'(?:method|function|variable) (.*)'", entry)
    sig = m.group(1) if m else entry
    depth, i = 0, 0
    for i, ch in enumerate(sig):               # the parameter list: the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
    else:
        i = len(sig)
    head, depth, j = sig[:i], 0, i
    while j > 0:                               # back to the space that starts the name
        ch = head[j - 1]
        if ch == ">":
            depth += 1
        elif ch == "<":
            depth -= 1
        elif ch in " *&" and depth == 0:
            break
        j -= 1
    return head[j:]


def is_std_entry(entry: str) -> bool:
    return entry_name(entry).startswith(("std::", "__gnu_cxx::"))
