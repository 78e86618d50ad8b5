"""Two builds at once in one build folder: the second waits for the first (and says who holds the
folder), each ends correctly with its own log; the lock goes with a killed holder."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from build_tools.builders.plan import Plan, Step
    folder, events, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def work():   # stands for fetching, patching and compiling in the shared tree
        with events.open("a") as f:
            f.write(f"start {name}\\n")
        time.sleep(1.5)
        (folder / "src").mkdir(parents=True, exist_ok=True)
        (folder / "src" / "tree").write_text(name)
        with events.open("a") as f:
            f.write(f"end {name}\\n")

    plan = Plan(f"build {name}", [Step("work", action=work),
                                 Step("compile", [sys.executable, "-c", f"print('compiled {name}')"])],
                [], folder / "build.log")
    plan.execute()
    print("ok", name, (folder / "src" / "tree").read_text())
""")


def _start(folder, events, name):
    return subprocess.Popen([sys.executable, "-c", BUILD, str(folder), str(events), name], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_build_in_one_folder_waits_and_both_end_correctly(tmp_path):
    folder = tmp_path / "build" / "pytorch-v2.6.0-overlay"
    events = tmp_path / "events"
    first = _start(folder, events, "A")
    deadline = time.monotonic() + 30
    while not events.exists() and time.monotonic() < deadline:   # A holds the folder
        time.sleep(0.05)
    second = _start(folder, events, "B")
    out_a, err_a = first.communicate(timeout=60)
    out_b, err_b = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (err_a, err_b)
    assert out_a.strip() == "ok A A" and out_b.strip() == "ok B B"
    assert events.read_text().split("\n")[:4] == ["start A", "end A", "start B", "end B"]
    assert f"waiting for {folder}: another build holds it (pid {first.pid}, build A" in err_b, err_b
    logs = sorted((folder / "logs").glob("*.log"))
    assert len(logs) == 2
    assert sorted("compiled A" in p.read_text() for p in logs) == [False, True]
    assert any("compiled B" in p.read_text() for p in logs)
    assert "compiled B" in (folder / "build.log").read_text()   # build.log names the latest run


def test_the_lock_goes_with_a_killed_holder(tmp_path):
    folder = tmp_path / "build" / "x"
    events = tmp_path / "events"
    first = _start(folder, events, "A")
    deadline = time.monotonic() + 30
    while not events.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    first.kill()
    first.communicate()
    second = _start(folder, events, "B")
    out_b, err_b = second.communicate(timeout=60)
    assert second.returncode == 0 and out_b.strip() == "ok B B", err_b
