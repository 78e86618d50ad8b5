"""Long steps keep the user informed: `progress.run_streamed` passes a program's own progress lines
through while it runs and says it is alive when the program is silent; the git fetch of a tag shows
git's progress (a real fetch from a local repository)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from build_tools import catalog
from build_tools.progress import run_streamed
from build_tools.upstream import sources


def _lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.strip()]


def test_a_silent_program_gets_a_heartbeat_and_its_lines_pass_through(capfd):
    code = ("import sys, time; print('starting', flush=True); time.sleep(2.2); "
            "print('finishing'); sys.exit(3)")
    r = run_streamed([sys.executable, "-c", code], "slow tool", every=0.5)
    err = _lines(capfd.readouterr().err)
    assert r.returncode == 3 and not r.ok
    assert r.output.split() == ["starting", "finishing"]
    assert err[0] == "    slow tool: starting"
    beats = [l for l in err if l.startswith("    slow tool: still running after ")]
    assert len(beats) >= 2, err
    assert "    slow tool: finishing" in err
    assert err[-1].startswith("    slow tool: failed (exit status 3) in ")


def test_carriage_return_redraws_count_as_lines_and_the_last_one_shows(tmp_path, capfd):
    code = "import sys; sys.stdout.write('copy 10%\\rcopy 55%\\rcopy 100%, done.\\n')"
    log = tmp_path / "log"
    with open(log, "w") as fh:
        r = run_streamed([sys.executable, "-c", code], "copy", every=0, log=fh)
    err = _lines(capfd.readouterr().err)
    assert r.ok
    assert err[:3] == ["    copy: copy 10%", "    copy: copy 55%", "    copy: copy 100%, done."]
    assert err[-1].startswith("    copy: done in ")
    assert log.read_bytes() == b"copy 10%\rcopy 55%\rcopy 100%, done.\n"  # the log keeps the raw output


def test_throttled_lines_end_with_the_latest(capfd):
    code = "for i in range(200): print(f'[{i + 1}/200] compiling unit {i}')"
    r = run_streamed([sys.executable, "-c", code], "c10 compile", every=30)
    err = _lines(capfd.readouterr().err)
    assert r.ok and len(r.output.splitlines()) == 200
    # the first line at once, the last one at the end, nothing in between within 30 s
    assert err == ["    c10 compile: [1/200] compiling unit 0", "    c10 compile: [200/200] compiling unit 199",
                   err[-1]] and err[-1].startswith("    c10 compile: done in ")


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(cwd), "PATH": "/usr/bin:/bin"})


def test_fetching_a_tag_shows_git_progress(tmp_path, monkeypatch, capfd):
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git("init", "-q", cwd=upstream)
    for i in range(40):  # enough objects for git to count and receive them
        (upstream / f"file{i}.txt").write_text(f"content {i}\n" * 50)
    _git("add", ".", cwd=upstream)
    _git("commit", "-q", "-m", "tree", cwd=upstream)
    _git("tag", "v9.9.9", cwd=upstream)
    want = subprocess.run(["git", "rev-parse", "v9.9.9^{commit}"], cwd=upstream, capture_output=True,
                          text=True, check=True).stdout.strip()
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LMS_PROGRESS_EVERY", "0")
    src = sources.Source(catalog.FRAMEWORKS["pytorch"], "git", str(upstream))

    assert sources._fetch_tag(src, "v9.9.9") == want
    err = _lines(capfd.readouterr().err)
    assert err[0] == f"==> fetching v9.9.9 from {upstream}"
    shown = [l for l in err if l.startswith("    git fetch v9.9.9: ")]
    assert any("objects" in l and "%" in l for l in shown), err  # git's own counters, as they came
    assert shown[-1].startswith("    git fetch v9.9.9: done in ")

    # a second time it is in the cache: one line, no fetch
    assert sources._fetch_tag(src, "v9.9.9") == want
    assert _lines(capfd.readouterr().err) == [f"    v9.9.9 already fetched from {upstream}"]


def test_a_tag_the_repository_lacks_is_named(tmp_path, monkeypatch, capfd):
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    _git("init", "-q", cwd=upstream)
    (upstream / "a").write_text("a\n")
    _git("add", ".", cwd=upstream)
    _git("commit", "-q", "-m", "a", cwd=upstream)
    monkeypatch.setenv("LMS_CACHE_DIR", str(tmp_path / "cache"))
    src = sources.Source(catalog.FRAMEWORKS["pytorch"], "git", str(upstream))
    try:
        sources._fetch_tag(src, "v0.0.1")
    except Exception as e:  # LmsError
        assert f"{upstream} has no tag v0.0.1" in str(e)
    else:
        raise AssertionError("fetching a missing tag succeeded")
    assert "git fetch v0.0.1: failed (exit status" in capfd.readouterr().err
