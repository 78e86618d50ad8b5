"""What the tools know about frameworks and tags.

A tag is supported exactly when `patches/<framework>/<tag>/profile.toml` exists. Everything here is
derived from the repository layout, never listed twice.
"""
from __future__ import annotations

import fnmatch
import os
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import LmsError

REPO_ROOT = Path(__file__).resolve().parent.parent


def patches_dir() -> Path:
    """The patches/ folder; $LMS_PATCHES_DIR points the tools at another one (the tests' own)."""
    env = os.environ.get("LMS_PATCHES_DIR")
    return Path(env).resolve() if env else REPO_ROOT / "patches"
PATCH_SUFFIX = "_large_model_support.patch"


@dataclass(frozen=True)
class Framework:
    name: str            # "pytorch" / "tensorflow": folder and patch-file name
    title: str           # for messages
    make_var: str        # the Makefile variable users set: TORCH= / TF=
    remote: str          # the official upstream git remote (the default source)
    version_file: str    # file in the tree that states its version
    version_pattern: str  # regex with one group: the version
    wheel_name: str      # the distribution name of the built wheel
    # How many parts of the version the tree's version file pins: PyTorch bumps version.txt per minor
    # release only (v1.13.1 and v2.6.0 say 1.13.0a0 and 2.6.0a0); TensorFlow's setup.py is exact.
    version_parts: int = 3

    def matches(self, found: str | None, expected: str) -> bool:
        n = self.version_parts
        return found is not None and found.split(".")[:n] == expected.split(".")[:n]

    def tree_version(self, tree: Path) -> str | None:
        """The version the tree says it is, or None where the file is missing or unreadable."""
        path = tree / self.version_file
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return None
        m = re.search(self.version_pattern, text, re.MULTILINE)
        return m.group(1) if m else None


FRAMEWORKS: dict[str, Framework] = {
    "pytorch": Framework(
        name="pytorch", title="PyTorch", make_var="TORCH",
        remote="https://github.com/pytorch/pytorch",
        version_file="version.txt", version_pattern=r"^\s*([0-9]+\.[0-9]+\.[0-9]+)",
        wheel_name="torch", version_parts=2,
    ),
    "tensorflow": Framework(
        name="tensorflow", title="TensorFlow", make_var="TF",
        remote="https://github.com/tensorflow/tensorflow",
        version_file="tensorflow/tools/pip_package/setup.py",
        version_pattern=r"^_VERSION\s*=\s*['\"]([0-9]+\.[0-9]+\.[0-9]+)",
        wheel_name="tensorflow",
    ),
}

ALIASES = {"torch": "pytorch", "tf": "tensorflow", "pt": "pytorch"}

TAG_RE = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+(?:-?rc[0-9]+)?$")


def framework(name: str) -> Framework:
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return FRAMEWORKS[key]
    except KeyError:
        raise LmsError(f"unknown framework {name!r}", hint=f"use one of: {', '.join(FRAMEWORKS)}") from None


def version_of_tag(tag: str) -> str:
    """v2.6.0 -> 2.6.0 (the version a tree of that tag states)."""
    if not TAG_RE.match(tag):
        raise LmsError(f"{tag!r} is not a release tag", hint="tags look like v2.6.0 or v2.14.1")
    return re.sub(r"-?rc[0-9]+$", "", tag[1:])


@dataclass(frozen=True)
class TagProfile:
    framework: Framework
    tag: str
    data: dict = field(hash=False, compare=False)
    # A patch the user brought (make build PATCH=...) instead of the committed one.
    patch_override: Path | None = field(default=None, compare=False)
    # For a tag with no profile of its own: the supported tag whose build settings it borrows.
    borrowed_from: str | None = None
    notes_before: tuple[str, ...] = field(default=(), compare=False)  # said first by notes()

    @property
    def dir(self) -> Path:
        return patches_dir() / self.framework.name / self.tag

    @property
    def version(self) -> str:
        return self.data.get("upstream", {}).get("version", version_of_tag(self.tag))

    @property
    def debian(self) -> dict | None:
        return self.data.get("debian")

    def build(self, mode: str) -> dict:
        return self.data.get("build", {}).get(mode, {})

    @property
    def wheel_sha256(self) -> dict[str, str]:
        """{official wheel file name: sha256} the profile pins: its top-level [wheel_sha256] and
        [build.overlay.wheel_sha256] together (the tools check every wheel they use against these)."""
        return {**self.data.get("wheel_sha256", {}), **self.build("overlay").get("wheel_sha256", {})}

    @property
    def edit_series(self) -> list[Path]:
        return sorted(self.dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))

    @property
    def patch_file(self) -> Path:
        if self.patch_override is not None:
            return self.patch_override
        return patches_dir() / f"{self.framework.name}_{self.tag}{PATCH_SUFFIX}"

    def notes(self) -> list[str]:
        """What a user must know before building with this profile."""
        out = list(self.notes_before)
        if self.borrowed_from:
            out.append(f"{self.framework.title} {self.tag} has no profile of its own: its build settings "
                       f"(Python, CUDA and compiler ranges, build environment) are {self.borrowed_from}'s, the "
                       f"nearest supported tag; {self.tag} may need others (check its own build docs).")
            out.append(f"the patch applied is {self.patch_file}: nothing in this repository has tested it on "
                       f"{self.tag}.")
        elif self.patch_override is not None:
            out.append(f"the patch applied is {self.patch_file}, not the committed "
                       f"{self.framework.name}_{self.tag}{PATCH_SUFFIX}: the wheel's version label is the same")
        return out


def _tree_files(root: Path) -> dict[str, Path]:
    """Files under `root` by their path relative to it (no Python caches)."""
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


def _check_rel(path: Path, dest, name) -> None:
    """Both sides of a shared.toml entry: relative paths without '.' or '..' parts."""
    if any(not isinstance(s, str) or s.startswith("/") or {"", ".", ".."} & set(s.split("/"))
           for s in (dest, name)):
        raise LmsError(f"{path}: {dest!r} = {name!r}: both sides must be relative paths "
                       f"without '.' or '..' parts")


def _shared_files(fw: Framework) -> dict[str, Path]:
    """patches/<fw>/shared.toml: upstream path -> file it places. [files] take files under
    patches/shared/; [repo_files] and [folders] take them from folders of this repository outside
    patches/ (the installable activation-swapping package, lms-swap/): a [repo_files] entry places one
    file, a [folders] entry every file of a folder at the same path under the upstream folder, except
    the files a [repo_files] entry places (each file lands once) and those [left_out] names for that
    folder ("<folder>" = ["<glob relative to it>", ...]: files of the package the patched build has no
    use for)."""
    path = patches_dir() / fw.name / "shared.toml"
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise LmsError(f"{path} is not valid TOML: {e}") from None
    tables = {"files": data.get("files", {}), "repo_files": data.get("repo_files", {}),
              "folders": data.get("folders", {}), "left_out": data.get("left_out", {})}
    if set(data) - set(tables) or not all(isinstance(t, dict) for t in tables.values()):
        raise LmsError(f"{path}: expected only a [files] table of \"<upstream path>\" = \"<file under "
                       f"patches/shared/>\" and, for files kept outside patches/, [repo_files] "
                       f"(\"<upstream path>\" = \"<file>\") and [folders] (\"<upstream folder>\" = "
                       f"\"<folder>\"), both from the repository's root, and [left_out] (\"<folder>\" = "
                       f"[\"<glob>\", ...])")
    for folder, globs in tables["left_out"].items():
        if folder not in tables["folders"].values() or not isinstance(globs, list) \
                or not all(isinstance(g, str) and g for g in globs):
            raise LmsError(f"{path}: [left_out] {folder!r} = {globs!r}: expected a folder of [folders] "
                           f"and a list of file name patterns relative to it")
    shared = patches_dir() / "shared"
    root = patches_dir().parent
    out = {}
    for dest, name in tables["files"].items():
        _check_rel(path, dest, name)
        if not (shared / name).is_file():
            raise LmsError(f"{path}: {dest} maps to patches/shared/{name}, which does not exist")
        out[dest] = shared / name
    singles = {}
    for dest, name in tables["repo_files"].items():
        _check_rel(path, dest, name)
        if not (root / name).is_file():
            raise LmsError(f"{path}: {dest} maps to {name} (from the repository's root), which does not exist")
        singles[dest] = root / name
    for dest, name in tables["folders"].items():
        _check_rel(path, dest, name)
        if not (root / name).is_dir():
            raise LmsError(f"{path}: folder {dest} maps to {name} (from the repository's root), which is "
                           f"not a folder")
        left_out = tables["left_out"].get(name, [])
        for rel, src in _tree_files(root / name).items():
            if src not in singles.values() and not any(fnmatch.fnmatchcase(rel, g) for g in left_out):
                _place(path, out, f"{dest}/{rel}", src)
    for dest, src in singles.items():
        _place(path, out, dest, src)
    return out


def _place(path: Path, out: dict[str, Path], dest: str, src: Path) -> None:
    """Record that shared.toml (`path`) places `src` at upstream `dest`; an upstream path takes one file."""
    if dest in out:
        raise LmsError(f"{path}: {dest} is placed twice, from {_shown(out[dest])} and from {_shown(src)}")
    out[dest] = src


def _shown(src: Path) -> str:
    """A placed file as messages name it: under patches/ (shared/...), else from the repository's root."""
    for base in (patches_dir(), patches_dir().parent):
        if src.is_relative_to(base):
            return src.relative_to(base).as_posix()
    return str(src)


def source_map(fw: Framework, tag: str | None = None) -> dict[str, Path]:
    """The LMS source files of the framework (and of `tag`, when given): upstream-relative path -> file
    in patches/ (or lms-swap/), sorted by path. Layers, in order: patches/<fw>/src/; the patches/shared/
    and lms-swap/ files that patches/<fw>/shared.toml places (never over a src/ file);
    patches/<fw>/<tag>/src/, which may replace a file of the layers before for that tag."""
    files = _tree_files(patches_dir() / fw.name / "src")
    for dest, path in _shared_files(fw).items():
        if dest in files:
            raise LmsError(f"{dest} is both patches/{fw.name}/src/{dest} and, by patches/{fw.name}/shared.toml, "
                           f"{_shown(path)}",
                           hint="keep one: delete the src/ file or the shared.toml entry")
        files[dest] = path
    if tag is not None:
        files.update(_tree_files(patches_dir() / fw.name / tag / "src"))
    return dict(sorted(files.items()))


def supported_tags(fw: Framework) -> list[str]:
    base = patches_dir() / fw.name
    tags = [p.parent.name for p in base.glob("*/profile.toml")] if base.is_dir() else []
    return sorted(tags, key=lambda t: [int(x) if x.isdigit() else x for x in re.split(r"[.v-]", t)])


def is_supported(fw: Framework, tag: str) -> bool:
    return (patches_dir() / fw.name / tag / "profile.toml").is_file()


def profile(fw: Framework, tag: str) -> TagProfile:
    """The profile of a supported tag; an unsupported tag is an error listing the supported ones."""
    path = patches_dir() / fw.name / tag / "profile.toml"
    if not path.is_file():
        supported = ", ".join(supported_tags(fw)) or "(none yet)"
        raise LmsError(
            f"{fw.title} {tag} is not supported: no LMS patch exists for that tag yet.\n"
            f"  Supported {fw.title} tags: {supported}",
            hint=(f"to start one from a tree you have, run `python -m build_tools rebase {fw.name} "
                  f"--onto {tag} --source <your tree, git URL or tarball>`; it tries the nearest "
                  f"supported patch with `git am -3` and reports conflicts file by file"),
        )
    with path.open("rb") as f:
        return TagProfile(fw, tag, tomllib.load(f))


def nearest_tag(fw: Framework, tag: str, tags: list[str] | None = None) -> str:
    """The supported tag (of `tags`, default all) closest to `tag`: the newest not newer, else the oldest."""
    tags = supported_tags(fw) if tags is None else tags
    if not tags:
        raise LmsError(f"no {fw.title} tag is supported yet")
    key = lambda t: tuple(int(x) for x in re.findall(r"\d+", version_of_tag(t)))
    target = key(tag)
    below = [t for t in tags if key(t) <= target]
    return max(below, key=key) if below else min(tags, key=key)


def profile_with_patch(fw: Framework, tag: str, patch: Path) -> TagProfile:
    """The profile for building `tag` with `patch`: the tag's own (with the patch swapped in) when the tag
    is supported, else the nearest supported tag's build settings under this tag's name and version
    (no Debian source: that is known per supported tag only)."""
    version_of_tag(tag)
    if is_supported(fw, tag):
        return replace(profile(fw, tag), patch_override=patch)
    near = nearest_tag(fw, tag)
    data = {k: v for k, v in profile(fw, near).data.items() if k != "debian"}
    data["upstream"] = {"version": version_of_tag(tag)}
    return TagProfile(fw, tag, data, patch_override=patch, borrowed_from=near)


def parse_patch_name(path: Path) -> tuple[Framework, str]:
    """patches/pytorch_v2.6.0_large_model_support.patch -> (pytorch, "v2.6.0")."""
    name = path.name
    if not name.endswith(PATCH_SUFFIX) or "_" not in name:
        raise LmsError(f"{name} is not named <framework>_<tag>{PATCH_SUFFIX}")
    fw_name, tag = name[: -len(PATCH_SUFFIX)].split("_", 1)
    return framework(fw_name), tag


def committed_patches() -> list[Path]:
    return sorted(patches_dir().glob(f"*{PATCH_SUFFIX}"))
