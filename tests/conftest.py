"""Shared fixtures: real upstream trees (Debian's release tarballs, imported by the build tools) and
the GPU marker.

Fixtures for other test modules:
  upstream_source(framework) -> Source    where the real trees come from
  upstream_tree(framework, tag) -> Path   pristine worktree of the real tree at the tag (read-only)
  lms_tree(framework, tag) -> Path        worktree of the tag + the LMS change composed from the
                                          current sources (what the exported patch produces; read-only)
Where the trees come from: $LMS_TEST_SOURCE (any --source value; default `debian`), cached in
$LMS_CACHE_DIR (default: .cache/build-tools in this checkout).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LMS_CACHE_DIR", str(REPO / ".cache" / "build-tools"))

# build_tools (and GitPython) are imported inside the fixtures, so that GPU conformance tests, which use
# none of them, also run on GPU runners that have only torch and pytest.


def _has_cuda_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


NO_GPU = "no CUDA GPU on this machine (gpu tests run with `make conformance` on a GPU runner)"


def pytest_collection_modifyitems(config, items):
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def test_source(framework: str) -> str:
    return os.environ.get(f"LMS_TEST_SOURCE_{framework.upper()}", os.environ.get("LMS_TEST_SOURCE", "debian"))


@pytest.fixture(scope="session")
def upstream_source():
    """framework -> the Source the real trees come from (see test_source)."""
    from build_tools import catalog
    from build_tools.upstream import parse_source

    def get(framework: str):
        fw = catalog.framework(framework)
        return parse_source(fw, test_source(fw.name))
    return get


@pytest.fixture(scope="session")
def upstream_repo(upstream_source):
    """(framework, tag) -> (bare repo, commit): the real tree imported into the cache."""
    def get(framework: str, tag: str):
        return upstream_source(framework).ensure(tag)
    return get


def _worktrees(upstream_repo, tmp_path_factory, label: str, prepare=None):
    """A factory fixture body: one worktree per (framework, tag), made on first use, removed at the end."""
    from build_tools import gitutil
    made: dict = {}

    def get(framework: str, tag: str) -> Path:
        if (framework, tag) not in made:
            repo, _ = upstream_repo(framework, tag)
            wt = gitutil.add_worktree(repo, tmp_path_factory.mktemp(f"{label}-{framework}-{tag}") / "tree", tag)
            made[(framework, tag)] = (repo, wt)
            if prepare:
                prepare(framework, tag, wt)
        return made[(framework, tag)][1]

    yield get
    for repo, wt in made.values():
        gitutil.remove_worktree(repo, wt)


@pytest.fixture(scope="session")
def upstream_tree(upstream_repo, tmp_path_factory):
    yield from _worktrees(upstream_repo, tmp_path_factory, "up")


@pytest.fixture(scope="session")
def lms_tree(upstream_repo, tmp_path_factory):
    from build_tools import catalog
    from build_tools.patch_factory import compose

    def with_lms(framework: str, tag: str, wt: Path) -> None:
        compose.compose(catalog.profile(catalog.framework(framework), tag), wt)

    yield from _worktrees(upstream_repo, tmp_path_factory, "lms", with_lms)


# ---- conformance report -----------------------------------------------------------------------------
# `make conformance` sets LMS_CONFORMANCE_REPORT: a JSON summary (machine, outcome of every test) for
# GPU runners to archive next to the junit XML.

_results: list[dict] = []
_deselected: list[str] = []
_started: list[float] = []


def _record_result(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        xfail = hasattr(report, "wasxfail")
        _results.append({"test": report.nodeid, "outcome": ("xfailed" if report.skipped else "xpassed") if xfail
                         else report.outcome, "seconds": round(report.duration, 3),
                         "reason": skip_reason(report) if report.skipped and not xfail else "",
                         "detail": str(report.longrepr)[-2000:] if report.outcome != "passed" else ""})


def pytest_runtest_logreport(report):
    _record_result(report)


def pytest_deselected(items):
    _deselected.extend(item.nodeid for item in items)


def pytest_sessionstart(session):
    import time
    _started.append(time.monotonic())


def pytest_sessionfinish(session, exitstatus):
    import time
    from tests import suite_record
    # --suite-record: the same outcomes as one line of a record (tests/suite_record.py)
    suite_record.write(session.config, _results, _deselected, exitstatus,
                       time.monotonic() - _started[0] if _started else 0.0)
    path = os.environ.get("LMS_CONFORMANCE_REPORT")
    if not path:
        return
    import json
    import platform
    gpu = ""
    if _has_cuda_gpu():
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    counts: dict = {}
    for r in _results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    skips: dict = {}
    for r in _results:
        if r["outcome"] == "skipped":
            kind = skip_kind(r["reason"]) or r["reason"]
            skips[kind] = skips.get(kind, 0) + 1
    Path(path).write_text(json.dumps({"host": platform.node(), "gpu": gpu, "exit_status": int(exitstatus),
                                      "counts": counts, "skips_by_reason": skips, "tests": _results}, indent=2))


# ---- skips: which are allowed, and how many of each ---------------------------------------------------
# Two kinds of skip are expected: `gpu` (a GPU test on a machine without one) and `no-wheel` (a test of a
# framework release with no official wheel for any Python the machine has: tests/wheel_pythons.py).
# `tag` covers the per-tag limits the conformance suite documents (tests/conformance/*/README.md).
# Every other skip hides a broken setup: with --no-unexpected-skips, or under `make conformance`
# (LMS_CONFORMANCE_REPORT), it is turned into a failure. The terminal summary counts skips per kind.
import re  # noqa: E402

from tests import gpu_requirements  # noqa: E402
from tests.wheel_pythons import NO_WHEEL_PATTERN  # noqa: E402

ALLOWED_SKIPS = [
    ("gpu", re.compile(re.escape(NO_GPU) + "$|needs two CUDA GPUs$")),
    ("no-wheel", re.compile(NO_WHEEL_PATTERN)),
    ("tag", re.compile(r"this tag's allocator has no trace trackers|this tag has no expandable segments without LMS")),
]


def skip_reason(report) -> str:
    lr = report.longrepr
    msg = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return msg[len("Skipped: "):] if msg.startswith("Skipped: ") else msg


def skip_kind(reason: str) -> str | None:
    """The allowed kind of a skip reason ("gpu", "no-wheel", "tag"), or None."""
    return next((kind for kind, rx in ALLOWED_SKIPS if rx.search(reason)), None)


def pytest_addoption(parser):
    from tests import suite_record
    suite_record.add_options(parser)
    parser.addoption("--no-unexpected-skips", action="store_true", default=False,
                     help="a skip whose reason is not an allowed one (gpu, no-wheel, tag) is a failure "
                          "(on by default when LMS_CONFORMANCE_REPORT is set: `make conformance`)")


def _strict_skips(config) -> bool:
    return bool(config.getoption("--no-unexpected-skips") or os.environ.get("LMS_CONFORMANCE_REPORT"))


def _selects_gpu_only(markexpr: str) -> bool:
    """True where -m's expression keeps a test marked `gpu` alone but drops an unmarked one."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression
        expr = Expression.compile(markexpr)
        return expr.evaluate(lambda name: name == "gpu") and not expr.evaluate(lambda name: False)
    except Exception:  # pragma: no cover - another pytest's private API
        return markexpr.strip() == "gpu"


def pytest_configure(config):
    from tests import suite_record
    suite_record.check(config)
    gpu_requirements.GPU_RUN = _selects_gpu_only(config.option.markexpr) or bool(os.environ.get("LMS_CONFORMANCE_REPORT"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and _strict_skips(item.config):
        reason = skip_reason(report)
        if skip_kind(reason) is None:
            report.outcome = "failed"
            report.longrepr = f"unexpected skip (allowed: {', '.join(k for k, _ in ALLOWED_SKIPS)}): {reason}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict = {}
    for rep in skipped:
        reason = skip_reason(rep)
        kind = skip_kind(reason) or f"other: {reason}"
        counts[kind] = counts.get(kind, 0) + 1
    terminalreporter.write_sep("=", "skips by reason")
    terminalreporter.write_line("skips: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(),
                                                                                    key=lambda kv: (-kv[1], kv[0]))))


@pytest.fixture(scope="session")
def m():
    """The activation-swapping package of this repository (lms-swap/, which the patch also places
    as torch.cuda.lms_swap), imported as ``lms_swap`` on the installed PyTorch: `make setup` installs
    it, and pytest's pythonpath (pyproject.toml) puts this checkout's lms-swap/src first."""
    import lms_swap
    return lms_swap
