"""python -m build_tools: the command line of the LMS build tools (the Makefile calls this)."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from . import LMS_VERSION, catalog
from .errors import LmsError
from .upstream import Source, parse_source

DESCRIPTION = f"""\
Large Model Support (LMS {LMS_VERSION}) build tools: get a framework's tree at a tag, apply the LMS
patch, build wheels; and the patch factory that makes the patches from the LMS sources in patches/.

Sources (--source, for every command that needs a tree):
  (default)        the official upstream git remote ({catalog.FRAMEWORKS['pytorch'].remote}, ...)
  debian           Debian's source package of the tag (orig tarball, fetched with apt-get)
  PATH             a local git repository or mirror holding the tag
  URL              a git URL (https://..., git@host:repo, file://...)
  FILE.tar.xz      a source tarball, path or http(s) URL: imported once into a cached git repo and tagged
With several frameworks in play (verify, export) a source can be given per framework: --source tensorflow=debian.
Downloads and imported repos are cached in $LMS_CACHE_DIR (default ~/.cache/lms-build-tools).
"""

EPILOG = """\
examples:
  python -m build_tools tags
  python -m build_tools build pytorch v2.6.0 --mode overlay --source debian
  python -m build_tools build tensorflow v2.14.1 --dry-run
  python -m build_tools build pytorch v1.4.0 --patch ~/pytorch_v1.4.0_lms.patch --dry-run
  python -m build_tools build tensorflow v2.1.0 --dry-run    # no patch ships: rebase the nearest
  python -m build_tools apply pytorch v2.6.0 --dest ../pytorch-lms
  python -m build_tools export --check --source debian
  python -m build_tools rebase pytorch --onto v2.7.0 --source ~/src/pytorch --dest ../pt-2.7
  python -m build_tools lms-swap --python /usr/bin/python3 --conda dist/conda
"""


def _sources(values: list[str] | None) -> tuple[str | None, dict[str, str]]:
    default, per = None, {}
    for v in values or []:
        fw, sep, spec = v.partition("=")
        if sep and fw.lower() in {*catalog.FRAMEWORKS, *catalog.ALIASES}:
            per[catalog.framework(fw).name] = spec
        else:
            default = v
    return default, per


def source_for(args, fw: catalog.Framework) -> Source:
    default, per = _sources(args.source)
    return parse_source(fw, per.get(fw.name, default))


def _profiles(args) -> list[catalog.TagProfile]:
    fws = [catalog.framework(args.framework)] if args.framework else list(catalog.FRAMEWORKS.values())
    if args.tag:
        return [catalog.profile(fws[0], args.tag)]
    return [catalog.profile(fw, t) for fw in fws for t in catalog.supported_tags(fw)]


# ---- commands ---------------------------------------------------------------------------------------

def cmd_tags(args) -> int:
    for fw in catalog.FRAMEWORKS.values():
        tags = catalog.supported_tags(fw)
        shipped = [t for t in tags if catalog.profile(fw, t).patch_file.exists()]
        print(f"{fw.name:11} {fw.make_var}=  supported: {', '.join(tags) or '-'}   "
              f"patch exported: {', '.join(shipped) or '-'}")
    return 0


def cmd_fetch(args) -> int:
    fw = catalog.framework(args.framework)
    catalog.version_of_tag(args.tag)
    repo, commit = source_for(args, fw).ensure(args.tag)
    print(f"{fw.name} {args.tag} {commit} {repo}")
    return 0


def cmd_export(args) -> int:
    from .patch_factory import export
    profiles = [p for p in _profiles(args) if args.tag or p.edit_series or catalog.source_map(p.framework, p.tag)]
    if not profiles:
        print("no LMS sources yet: nothing to export")
        return 0
    if args.check:
        export.check_all(profiles, {p.framework.name: source_for(args, p.framework) for p in profiles})
        print(f"{len(profiles)} patch(es) up to date")
    else:
        for p in profiles:
            print(export.export(p, source_for(args, p.framework)))
    return 0


def cmd_apply(args) -> int:
    from .patch_ops.apply import apply_patch
    fw = catalog.framework(args.framework)
    patch = Path(args.patch) if args.patch else catalog.profile(fw, args.tag).patch_file
    applied = apply_patch(fw, args.tag, source_for(args, fw), patch, Path(args.dest))
    print(applied.worktree)
    return 0


def cmd_verify(args) -> int:
    from .patch_ops.verify import verify
    patches = [Path(p) for p in args.patches] or catalog.committed_patches()
    verify(patches, lambda fw: source_for(args, fw))
    return 0


def cmd_rebase(args) -> int:
    from .patch_ops.rebase import rebase
    fw = catalog.framework(args.framework)
    catalog.version_of_tag(args.onto)
    from_source = parse_source(fw, args.from_source) if args.from_source else source_for(args, fw)
    report = rebase(fw, args.onto, source_for(args, fw), from_source, Path(args.dest),
                    from_tag=args.from_tag, patch=Path(args.patch) if args.patch else None)
    return 0 if report.clean else 3


def cmd_dev_tree(args) -> int:
    from .patch_factory.devtree import make_dev_tree
    fw = catalog.framework(args.framework)
    print(make_dev_tree(catalog.profile(fw, args.tag), source_for(args, fw), Path(args.dest)))
    return 0


def cmd_save_edits(args) -> int:
    from .patch_factory.devtree import save_edits
    fw = catalog.framework(args.framework)
    for p in save_edits(catalog.profile(fw, args.tag), Path(args.dest)):
        print(p)
    return 0


def _build_profile(args, fw: catalog.Framework, source: Source):
    """(profile, steps to run before the build's own): the tag's own profile; with --patch, the user's
    patch (on an unsupported tag, with the nearest supported tag's build settings); for an unsupported
    tag without --patch, the nearest shipped patch rebased onto it first."""
    from .builders import common
    from .builders.plan import Step
    if args.patch:
        from .patch_ops.user_patch import resolve
        return catalog.profile_with_patch(fw, args.tag, resolve(args.patch, args.patch_sha256)), []
    if catalog.is_supported(fw, args.tag):
        return catalog.profile(fw, args.tag), []
    from .patch_ops.rebase import nearest_supported, rebase_to_patch
    try:
        near = nearest_supported(fw, args.tag)
    except LmsError:
        catalog.profile(fw, args.tag)  # nothing to rebase from: the plain "not supported" error
        raise
    work = common.BUILD_ROOT / f"{fw.name}-{args.tag}-rebase"
    wt, out = work / "src", work / f"{fw.name}_{args.tag}_rebased_from_{near}.patch"
    supported = ", ".join(catalog.supported_tags(fw))
    prof = replace(catalog.profile_with_patch(fw, args.tag, out), notes_before=(
        f"{fw.title} {args.tag} is not supported: no LMS patch ships for it (Supported {fw.title} tags: "
        f"{supported}); this plan starts from {near}'s patch, rebased onto {args.tag}. With a patch of your "
        f"own: PATCH=<file or URL>",))
    step = Step(f"no {fw.title} {args.tag} patch ships: rebase the shipped {near} patch onto {args.tag} with "
                f"`git am -3`; stop with a file-by-file report of what is left if conflicts remain, else write "
                f"the result to {out}",
                action=lambda: rebase_to_patch(fw, args.tag, source, near, wt, out),
                shows=[*source.plan_commands(args.tag),
                       f"python -m build_tools rebase {fw.name} --onto {args.tag} --from {near} --dest {wt}",
                       f"git -C {wt} format-patch --stdout {args.tag}..HEAD > {out}"])
    return prof, [step]


def cmd_build(args) -> int:
    fw = catalog.framework(args.framework)
    catalog.version_of_tag(args.tag)
    source = source_for(args, fw)
    prof, before = _build_profile(args, fw, source)
    dist = Path(args.dist).resolve()
    if args.mode == "overlay" and prof.borrowed_from:
        raise LmsError(f"the overlay build needs the official wheel of a supported tag; {fw.title} "
                       f"{args.tag} has no profile", hint=f"use the full build: make build "
                       f"{fw.make_var}={args.tag} MODE=full" + (f" PATCH={args.patch}" if args.patch else ""))
    if args.mode == "overlay":
        if fw.name != "pytorch":
            raise LmsError(f"{fw.title} has no overlay build: its LMS patch needs a full build",
                           hint=f"make build {fw.make_var}={args.tag}")
        from .builders import common, pytorch_overlay
        from .packagers.steps import conda_step
        plan = pytorch_overlay.plan(prof, source, jobs=args.jobs, dist=dist)
        plan.steps.append(conda_step(plan, dist, f"torch-{common.local_version(prof)}-*.whl"))
    else:
        from .builders import pytorch_full, tensorflow_full
        module = pytorch_full if fw.name == "pytorch" else tensorflow_full
        plan = module.plan(prof, source, jobs=args.jobs, dist=dist)
    plan.steps[:0] = before
    plan.notes += prof.notes()
    if args.tree_only:
        plan = plan.until_tree()
    if args.dry_run:
        print(plan.render())
        return 0
    plan.execute()
    return 0


def cmd_lms_swap(args) -> int:
    from . import lms_swap_wheel
    built = lms_swap_wheel.build(args.python, Path(args.dist), net=not args.no_net)
    if args.conda:
        pkg = lms_swap_wheel.to_conda(built.path, Path(args.conda))
        print(f"conda package: {pkg.path}")
    return 0


# ---- parser -----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    # the console script `lms-build` (pyproject.toml) names itself; `python -m build_tools` otherwise
    prog = "lms-build" if Path(sys.argv[0]).name == "lms-build" else "python -m build_tools"
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"LMS build tools {LMS_VERSION}")
    p.add_argument("--cache-dir", help="where downloads and imported repos are kept (default: $LMS_CACHE_DIR "
                                       "or ~/.cache/lms-build-tools)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name, func, help_text, *, framework=True, tag=True, source=True, tag_optional=False):
        sp = sub.add_parser(name, help=help_text, description=help_text,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if framework:
            sp.add_argument("framework", nargs="?" if tag_optional else None, help="pytorch (torch) or tensorflow (tf)")
        if tag:
            sp.add_argument("tag", nargs="?" if tag_optional else None, help="release tag, e.g. v2.6.0")
        if source:
            sp.add_argument("--source", action="append", metavar="SPEC",
                            help="where the tree comes from (see `python -m build_tools --help`); FW=SPEC per framework")
        sp.set_defaults(func=func)
        return sp

    add("tags", cmd_tags, "list supported tags and which patches are exported", framework=False, tag=False, source=False)
    add("fetch", cmd_fetch, "get a tag's tree into the cache (download / import / git fetch) and print its commit")
    sp = add("export", cmd_export, "patch factory: write patches/<fw>_<tag>_large_model_support.patch from the "
             "sources (all supported tags when none is named)", tag_optional=True)
    sp.add_argument("--check", action="store_true", help="write nothing; fail if a committed patch differs from a fresh export")
    sp = add("apply", cmd_apply, "make a worktree at the tag and `git am` the LMS patch into it (all or nothing)")
    sp.add_argument("--dest", required=True, help="new folder for the worktree")
    sp.add_argument("--patch", help="a patch file other than the committed one")
    sp = add("verify", cmd_verify, "apply every committed patch to its tag and print a table", framework=False, tag=False)
    sp.add_argument("patches", nargs="*", help="patch files (default: all in patches/)")
    sp = add("rebase", cmd_rebase, "try a shipped patch on another tag with `git am -3`; report conflicts "
             "file by file and leave the tree to finish (exit 3 when conflicts remain)", tag=False)
    sp.add_argument("--onto", required=True, help="the tag to move to, e.g. v2.7.0 or v1.4.0")
    sp.add_argument("--from", dest="from_tag", help="the shipped tag whose patch to start from (default: nearest)")
    sp.add_argument("--from-source", help="where the --from tag's tree comes from (default: same as --source)")
    sp.add_argument("--patch", help="patch file to rebase (default: the --from tag's committed patch)")
    sp.add_argument("--dest", required=True, help="new folder for the rebased worktree")
    sp = add("dev-tree", cmd_dev_tree, "developer loop: worktree with the tag's edit series as commits and src/ linked in")
    sp.add_argument("--dest", required=True, help="new folder for the worktree")
    sp = add("save-edits", cmd_save_edits, "developer loop: write the dev tree's commits after the tag as the edit "
             "series patches/<fw>/<tag>/NNNN-*.patch", source=False)
    sp.add_argument("--dest", required=True, help="the dev tree")
    sp = add("build", cmd_build, "build a wheel of the framework at the tag with LMS (into dist/)")
    sp.add_argument("--mode", choices=["full", "overlay"], default="full",
                    help="full: the framework's own build (hours); overlay (PyTorch): rebuild only libc10_cuda on "
                         "top of the official wheel (minutes)")
    sp.add_argument("--dry-run", action="store_true", help="print the exact plan and the toolchain check; do nothing")
    sp.add_argument("--tree-only", action="store_true",
                    help="stop once the patched tree is in build/<framework>-<tag>-<mode>/src (made under the "
                         "build folder's lock, as a build makes it); no toolchain needed")
    sp.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    sp.add_argument("--dist", default=str(catalog.REPO_ROOT / "dist"), help="where the wheel goes (default: dist/)")
    sp.add_argument("--patch", metavar="FILE_OR_URL",
                    help="build with this patch instead of the committed one (`git format-patch` output or a "
                         "plain diff; any tag, e.g. IBM's published v1.4.0 / v2.1.0 LMS patches: a tag with no "
                         "profile borrows the nearest supported tag's build settings, full build only). "
                         "Without it, a tag with no shipped patch starts from the nearest one, rebased")
    sp.add_argument("--patch-sha256", metavar="HEX",
                    help="the sha256 the --patch file must have (required for an http:// URL; https is checked "
                         "by TLS alone without it)")
    sp = add("lms-swap", cmd_lms_swap, "build the lms-swap wheel (activation swapping for stock PyTorch) with its "
             "eviction net and its pluggable LMS allocator compiled for the torch of --python: version 0.1.0+torch<X.Y.Z>.<cuNNN>, for that torch "
             "alone (needs a CUDA build of torch, a C++ compiler and the CUDA runtime headers; no GPU)",
             framework=False, tag=False, source=False)
    sp.add_argument("--python", default=sys.executable,
                    help="the interpreter whose torch to build for (default: this one)")
    sp.add_argument("--dist", default=str(catalog.REPO_ROOT / "dist"), help="where the wheel goes (default: dist/)")
    sp.add_argument("--no-net", action="store_true",
                    help="the pure-Python wheel (0.1.0, any torch >= 2.4): the net and the allocator are "
                         "compiled at first use")
    sp.add_argument("--conda", metavar="CHANNEL",
                    help="also make its .conda package into this local channel folder (indexed)")
    return p


def os_error_line(e: OSError) -> str:
    """`<file>: <cause>` (both files for a rename or link), without a traceback."""
    files = " -> ".join(str(f) for f in (e.filename, e.filename2) if f)
    cause = e.strerror or str(e) or type(e).__name__
    return f"{files}: {cause}" if files else cause


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cache_dir:
        os.environ["LMS_CACHE_DIR"] = str(Path(args.cache_dir).resolve())
    try:
        return args.func(args)
    except LmsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # a disk or file problem (full disk, permissions, a folder gone): its file and cause, one line
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
