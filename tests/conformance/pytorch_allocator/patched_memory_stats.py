"""The patched tree's ``torch.cuda.memory_stats()`` over a given raw statistics dict, without torch.

``torch/cuda/memory.py`` of the LMS tree (its ``memory_stats`` and ``memory_stats_as_nested_dict``,
taken out of the file with ``ast``) runs as written; only what it takes from torch is stood in:
``is_initialized()`` is True, the device index is the one passed, and
``torch._C._cuda_memoryStats`` returns ``raw``. Its ``from . import lms`` imports the tree's
``torch/cuda/lms.py``, which loads the libc10_cuda.so named by ``PYTORCH_LMS_LIBC10_CUDA`` (the
patched build the caller has loaded), so the ``lms.*`` values are the allocator's own.

Used by driver.py (scenario ``memory_stats``, GPU: the keys move with a real spill) and by
tests/test_pytorch_allocator_build.py (CPU: the merge is wired in and returns the lms keys).
"""
from __future__ import annotations

import ast
import collections
import importlib.util
import sys
import types
import typing
from pathlib import Path

FUNCS = ("memory_stats", "memory_stats_as_nested_dict")


def load(tree: Path | str, raw_stats) -> typing.Callable[[int], dict]:
    """memory_stats(device) of ``tree``'s torch/cuda/memory.py; ``raw_stats(device)`` gives the raw dict."""
    cuda = Path(tree) / "torch" / "cuda"
    pkg_name = "_lms_tree_torch_cuda"
    pkg = sys.modules.get(pkg_name)
    if pkg is None:
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(cuda)]
        spec = importlib.util.spec_from_file_location(pkg_name + ".lms", cuda / "lms.py")
        lms = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(lms)
        pkg.lms = lms
        sys.modules[pkg_name] = pkg
        sys.modules[pkg_name + ".lms"] = lms
    src = (cuda / "memory.py").read_text()
    fns = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in FUNCS]
    missing = set(FUNCS) - {f.name for f in fns}
    if missing:
        raise RuntimeError(f"{cuda / 'memory.py'} has no {sorted(missing)}")
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_memoryStats=raw_stats))
    ns = {"__name__": pkg_name + ".memory", "__package__": pkg_name, "collections": collections,
          "torch": torch, "is_initialized": lambda: True, "Device": object,
          "_get_device_index": lambda d, optional=False: 0 if d is None else int(d)}
    ns.update({k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple", "Union")})
    mod = ast.Module(body=fns, type_ignores=[])
    exec(compile(mod, str(cuda / "memory.py"), "exec"), ns)
    return ns["memory_stats"]
