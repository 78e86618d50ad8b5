"""Which manylinux platform tag a wheel deserves after one of its libraries was rebuilt here.

The official torch 2.6.0 wheel was compiled on an old distribution (glibc 2.17, GCC 9 devtoolset),
so it runs almost anywhere. A library compiled on this machine needs this machine's newer glibc and
libstdc++ symbol versions. Keeping the old tag would let pip install the wheel where it then fails
to load, so the overlay wheel gets the tag of the oldest manylinux policy that still provides every
symbol version the rebuilt library needs (policies: auditwheel's manylinux-policy.json).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from ..errors import LmsError


@lru_cache(maxsize=1)
def policies() -> list[dict]:
    try:
        import auditwheel
    except ImportError as e:  # pragma: no cover - dependency missing
        raise LmsError("the overlay build needs auditwheel's manylinux policy data", hint="pip install auditwheel") from e
    path = Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json"
    data = json.loads(path.read_text())
    return sorted((p for p in data if p["name"].startswith("manylinux_")), key=lambda p: -p["priority"])


def _ok(policy: dict, needs: dict[str, list[str]], arch: str) -> bool:
    have = policy.get("symbol_versions", {}).get(arch, {})
    for lib, versions in needs.items():
        if lib not in have:
            continue  # a library the policy does not constrain (e.g. libcudart's own versions)
        allowed = set(have[lib])
        if any(v not in allowed for v in versions):
            return False
    return True


def oldest_policy(needs: dict[str, list[str]], arch: str = "x86_64") -> dict:
    for p in policies():
        if _ok(p, needs, arch):
            return p
    raise LmsError(f"no manylinux policy provides the symbol versions {needs}")


def policy_of_tag(platform_tag: str) -> dict | None:
    """manylinux1_x86_64 / manylinux2014_x86_64 / manylinux_2_17_x86_64 -> that policy."""
    m = re.match(r"(manylinux[0-9_]*?)_(x86_64|aarch64|ppc64le|s390x|i686)$", platform_tag)
    if not m:
        return None
    name = m.group(1)
    for p in policies():
        if p["name"] == name or name in p.get("aliases", []):
            return p
    return None


def platform_tag_for(original_tag: str, needs: dict[str, list[str]]) -> tuple[str, dict]:
    """The platform tag the rewritten wheel must carry, and the policy that it names."""
    m = re.search(r"(x86_64|aarch64|ppc64le|s390x|i686)$", original_tag)
    arch = m.group(1) if m else "x86_64"
    orig = policy_of_tag(original_tag)
    need = oldest_policy(needs, arch)
    if orig is not None and orig["priority"] <= need["priority"] and _ok(orig, needs, arch):
        return original_tag, orig
    return f"{need['name']}_{arch}", need


def versions_provided(policy: dict, arch: str = "x86_64") -> dict[str, set]:
    return {k: set(v) for k, v in policy.get("symbol_versions", {}).get(arch, {}).items()}
