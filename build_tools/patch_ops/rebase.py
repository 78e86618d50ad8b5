"""`rebase`: try a shipped patch on another tag with `git am -3` and report conflicts file by file.

This is how a user starts on a tag we do not ship: the result (clean, or with conflict markers to
resolve) is left in a worktree, from which `save-edits` makes the new tag's edit series.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import catalog, gitutil, patchfile
from ..catalog import Framework
from ..errors import LmsError
from ..progress import info, step
from ..upstream import Source
from .apply import am


@dataclass
class RebaseReport:
    from_tag: str
    onto: str
    worktree: Path
    clean: bool
    files: list[tuple[str, str]] = field(default_factory=list)   # (path, status)

    def render(self) -> str:
        head = (f"rebase of the {self.from_tag} patch onto {self.onto}: "
                + ("applies cleanly" if self.clean else f"{sum(s != 'merged cleanly' for _, s in self.files)} file(s) need work"))
        width = max([len(p) for p, _ in self.files] + [4])
        lines = [head, f"  {'FILE'.ljust(width)}  STATUS"]
        lines += [f"  {p.ljust(width)}  {s}" for p, s in self.files]
        return "\n".join(lines)


def nearest_supported(fw: Framework, onto: str) -> str:
    tags = [t for t in catalog.supported_tags(fw) if catalog.profile(fw, t).patch_file.exists()]
    if not tags:
        raise LmsError(f"no {fw.title} patch is exported yet to rebase from", hint="`make patches` first")
    return catalog.nearest_tag(fw, onto, tags)


def rebase(fw: Framework, onto: str, source: Source, from_source: Source, dest: Path,
           from_tag: str | None = None, patch: Path | None = None) -> RebaseReport:
    from_tag = from_tag or nearest_supported(fw, onto)
    patch = patch or catalog.profile(fw, from_tag).patch_file
    if not patch.is_file():
        raise LmsError(f"patch {patch} not found")
    repo, _ = source.ensure(onto)
    # git am -3 rebuilds the pre-image from the blobs the patch names: they live at the patch's own tag.
    if not gitutil.has_ref(repo, f"refs/tags/{from_tag}"):
        from_repo, _ = from_source.ensure(from_tag)
        if from_repo != repo:
            step(f"bringing {from_tag} into {repo.name} for the 3-way merge")
            gitutil.run(repo, "fetch", "--no-tags", str(from_repo), f"+refs/tags/{from_tag}:refs/tags/{from_tag}")
    step(f"git am -3 {patch.name} on {fw.title} {onto}")
    wt = gitutil.add_worktree(repo, dest, onto)
    r = am(wt, patch, three_way=True)
    files = patchfile.parse(patchfile.read(patch))
    if r.ok:
        report = RebaseReport(from_tag, onto, wt, True, [(f.path, "merged cleanly") for f in files])
    else:
        # unmerged paths with git's two-letter state: UU both changed, DU the tag lacks the file, ...
        unmerged = {line[3:]: line[:2] for line in gitutil.run(wt, "status", "--porcelain").out.splitlines()
                    if line[:2] in ("UU", "DU", "UD", "AA", "AU", "UA", "DD")}
        output = r.err + str(r.out)
        rows = []
        for f in files:
            if f.path in unmerged:
                if unmerged[f.path] == "DU":
                    rows.append((f.path, "CONFLICT: this tag has no such file (the code lives elsewhere "
                                         "there); the patched file was left in place to port by hand"))
                    continue
                text = (wt / f.path).read_text(errors="replace") if (wt / f.path).exists() else ""
                n = len(re.findall(r"^<<<<<<< ", text, re.MULTILINE))
                rows.append((f.path, f"CONFLICT ({n} region(s) with markers)" if n else
                             f"CONFLICT (git state {unmerged[f.path]})"))
            elif re.search(rf"(error|CONFLICT).*{re.escape(f.path)}", output):
                rows.append((f.path, "FAILED: " + patchfile.describe_failure(patchfile.read(patch), output)
                             .splitlines()[0]))
            else:
                rows.append((f.path, "merged cleanly"))
        if not unmerged and all(s == "merged cleanly" for _, s in rows):
            rows.append(("(git am)", output.strip().splitlines()[-1] if output.strip() else "failed"))
        report = RebaseReport(from_tag, onto, wt, False, rows)
    print(report.render())
    if report.clean:
        info(f"the rebased tree is at {wt}")
    else:
        info(f"resolve the conflicts in {wt}, then `git add` the files and `git am --continue` there")
    info(f"to ship it: create patches/{fw.name}/{onto}/profile.toml (copy one beside it), then "
         f"`python -m build_tools save-edits {fw.name} {onto} --dest {wt}` and `make patches`")
    return report


def rebase_to_patch(fw: Framework, onto: str, source: Source, from_tag: str, worktree: Path, out: Path) -> Path:
    """`make build` of a tag with no patch of its own: the nearest shipped patch rebased onto it, written as
    one `git format-patch` file at `out` when it merges cleanly; otherwise an error carrying the
    file-by-file report and the commands that finish the job (the conflicted tree is left at `worktree`)."""
    if worktree.exists():
        gitutil.remove_worktree(source.repo, worktree)
    out.unlink(missing_ok=True)
    report = rebase(fw, onto, source, source, worktree, from_tag=from_tag)
    if not report.clean:
        raise LmsError(
            f"the {from_tag} patch does not rebase cleanly onto {fw.title} {onto}; what is left:\n"
            + report.render(),
            hint=(f"resolve the conflicts in {report.worktree}, `git add` the files and `git am --continue` "
                  f"there, then `git -C {report.worktree} format-patch --stdout {onto}..HEAD > my.patch` and "
                  f"`make build {fw.make_var}={onto} PATCH=my.patch`"))
    text = gitutil.run(report.worktree, "format-patch", "--stdout", f"{onto}..HEAD").out
    tmp = out.with_suffix(".part")
    tmp.write_text(text)
    tmp.replace(out)
    info(f"rebased patch: {out}")
    return out
