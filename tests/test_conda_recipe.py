"""The conda-build recipe (recipes/pytorch-lms): rendered and checked without conda-build.

What this checks: the Jinja2 template renders with conda-build's context functions (`compiler`,
`stdlib`, `pin_subpackage`, `pin_compatible`, variables from conda_build_config.yaml), `# [selector]`
lines are applied like conda-build does, the result is YAML with the sections and keys conda-build
requires, every requirement is a valid conda MatchSpec (parsed by py-rattler), the version and tag
agree with patches/pytorch/v2.6.0/profile.toml, the patch file it names is where the exporter writes
it, the build script uses the profile's build environment. What it does NOT check: that conda-build
itself accepts it or that the build succeeds (conda-build is not installable here, and a PyTorch
source build takes hours on a GPU build machine).
"""
from __future__ import annotations

import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "pytorch-lms"

# conda-build's required / known top-level sections and keys (conda_build.metadata.FIELDS, abridged)
FIELDS = {
    "package": {"name", "version"},
    "source": {"git_url", "git_rev", "git_depth", "patches", "url", "sha256", "path", "folder"},
    "build": {"number", "string", "skip", "script_env", "run_exports", "script", "noarch", "entry_points",
              "ignore_run_exports", "missing_dso_whitelist", "rpaths"},
    "requirements": {"build", "host", "run", "run_constrained"},
    "test": {"requires", "imports", "commands", "source_files", "files"},
    "about": {"home", "license", "license_family", "license_file", "summary", "description", "dev_url", "doc_url"},
    "extra": None,
}


def apply_selectors(text: str, ns: dict) -> str:
    """conda-build's selector preprocessing: a line ending in `# [expr]` is kept iff expr is true."""
    out = []
    for line in text.splitlines():
        m = re.search(r"#\s*\[([^\]]+)\]\s*$", line)
        if m:
            if not eval(m.group(1), {"__builtins__": {}}, ns):  # noqa: S307 - our own recipe
                continue
            line = line[: m.start()].rstrip()
        out.append(line)
    return "\n".join(out) + "\n"


def load_file_data(name: str, fileformat: str | None = None, from_recipe_dir: bool = False, **kw) -> dict:
    """conda-build's load_file_data for a TOML file named from the recipe's folder."""
    assert from_recipe_dir and (fileformat or name.rsplit(".", 1)[1]) == "toml", name
    with open(RECIPE / name, "rb") as f:
        return tomllib.load(f)


def render(variant: dict) -> dict:
    ns = {"linux": True, "linux64": True, "osx": False, "win": False, "unix": True, "x86_64": True,
          "aarch64": False, "py": int(variant["python"].replace(".", ""))}
    text = apply_selectors((RECIPE / "meta.yaml").read_text(), ns)
    compilers = {"c": "gcc_linux-64", "cxx": "gxx_linux-64", "cuda": "cuda-nvcc_linux-64"}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    ctx = {
        "compiler": lambda lang: compilers[lang],
        "stdlib": lambda lang: f"sysroot_linux-64 {variant['c_stdlib_version']}.*",
        "pin_subpackage": lambda name, min_pin="x.x.x.x.x.x", max_pin="x", exact=False: f"{name} >=2.6.0,<2.7.0a0",
        "pin_compatible": lambda name, **kw: name,
        "cuda_compiler_version": variant["cuda_compiler_version"], "lms_tag": variant["lms_tag"],
        "load_file_data": load_file_data,
        "PY_VER": variant["python"], "PKG_BUILDNUM": 0,
    }
    return yaml.safe_load(env.from_string(text).render(**ctx))


@pytest.fixture(scope="module")
def variant():
    cfg = yaml.safe_load((RECIPE / "conda_build_config.yaml").read_text())
    return {k: str(v[0]) for k, v in cfg.items()}


@pytest.fixture(scope="module")
def meta(variant):
    return render(variant)


@pytest.fixture(scope="module")
def profile(variant):
    with open(REPO / "patches" / "pytorch" / variant["lms_tag"] / "profile.toml", "rb") as f:
        return tomllib.load(f)


def test_sections_and_keys(meta):
    assert set(meta) <= set(FIELDS), set(meta) - set(FIELDS)
    for section in ("package", "source", "build", "requirements", "test", "about"):
        assert section in meta, section
    for section, keys in FIELDS.items():
        if keys is not None and section in meta:
            assert set(meta[section]) <= keys, (section, set(meta[section]) - keys)
    assert isinstance(meta["build"]["number"], int)


def test_version_tag_and_patch_agree_with_the_profile(meta, profile):
    from build_tools.catalog import PATCH_SUFFIX
    assert meta["package"]["name"] == "pytorch"
    assert str(meta["package"]["version"]) == profile["upstream"]["version"]
    assert meta["source"]["git_rev"] == "v" + profile["upstream"]["version"]
    (patch,) = meta["source"]["patches"]
    target = (RECIPE / patch).resolve()
    assert target == (REPO / "patches" / f"pytorch_v{profile['upstream']['version']}{PATCH_SUFFIX}").resolve()
    assert meta["build"]["string"].startswith("lms1_cuda124_py311_")


def test_requirements_are_matchspecs(meta):
    import rattler
    n = 0
    for sec in ("build", "host", "run", "run_constrained"):
        for spec in meta["requirements"][sec]:
            rattler.MatchSpec(str(spec))
            n += 1
    for spec in meta["build"]["run_exports"]["weak"]:
        rattler.MatchSpec(spec)
    assert n > 20
    run = {str(s).split()[0] for s in meta["requirements"]["run"]}
    assert {"python", "filelock", "typing_extensions", "sympy", "networkx", "jinja2", "fsspec"} <= run


def test_test_section_checks_lms(meta):
    assert "torch" in meta["test"]["imports"]
    assert any("set_enabled_lms" in c for c in meta["test"]["commands"])


def test_build_script_uses_profile_env(profile):
    script = (RECIPE / "build.sh").read_text()
    for key in ("USE_CUDA", "USE_CUDNN", "USE_DISTRIBUTED", "USE_NCCL", "BUILD_TEST"):
        val = profile["build"]["full"]["env"][key]
        assert re.search(rf"\b{key}={val}\b", script), key
    assert profile["build"]["full"]["env"]["TORCH_CUDA_ARCH_LIST"] in script


def test_selectors_drop_other_platforms(variant):
    text = apply_selectors("a: 1\nb: 2  # [win]\nc: 3  # [linux]\n", {"win": False, "linux": True})
    assert yaml.safe_load(text) == {"a": 1, "c": 3}
    # the recipe skips everything that is not linux-64
    ns_win = {"linux": False, "linux64": False, "osx": False, "win": True, "unix": False, "x86_64": True,
              "aarch64": False, "py": 311}
    skipped = apply_selectors((RECIPE / "meta.yaml").read_text(), ns_win)
    assert "skip: true" in skipped


def test_the_version_is_read_from_the_profile_not_written_in_the_recipe(variant):
    text = (RECIPE / "meta.yaml").read_text()
    version = tomllib.loads((REPO / "patches" / "pytorch" / variant["lms_tag"] / "profile.toml").read_text())
    assert version["upstream"]["version"] not in text.replace("<version>", "")
    assert 'load_file_data("../../patches/pytorch/" ~ tag ~ "/profile.toml"' in text
