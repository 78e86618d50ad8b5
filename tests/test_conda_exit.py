"""py-rattler calls leave no rattler thread inside Python, so the interpreter can shut down safely.

The bug: py-rattler completes an asyncio future from a tokio thread (loop.call_soon_threadsafe, whose
self-pipe write releases the GIL). When the main thread took the result and reached interpreter shutdown
before that thread had the GIL back, CPython (< 3.14) pthread_exit()ed the thread and its unwind dropped
Python references without the GIL: SIGSEGV/SIGBUS at exit (`make build` failed so after its conda step
printed "done"). See conda._run_rattler. Every crash seen (12 of 290 fresh processes indexing a channel)
had a tokio thread still in asyncio's _write_to_self when index_channel returned; no clean exit had one.

So the real check: a fresh Python process calls index_channel, query_records (what install() uses) and
solve_report repeatedly on a local channel, pausing between calls (an idle runtime makes the race likely),
and after each call no thread that Python did not start may still execute Python code; then it must exit
0. Without the fix the thread was still in Python after 18, 51 and 21 of 60 calls respectively."""
from __future__ import annotations

import _thread
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The foreign-thread check is written out here, not taken from the helper under test.
CHILD = """
import json, sys, threading, time
from pathlib import Path
from build_tools.packagers import conda
ch = Path(sys.argv[1])
calls = {"index": lambda: conda.index_channel(ch), "query": lambda: conda.query_records(ch, "racepkg"),
         "solve": lambda: conda.solve_report(ch, "racepkg")}
hits = {}
for name, call in calls.items():
    hits[name] = 0
    for _ in range(int(sys.argv[2])):
        call()
        ours = {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
        hits[name] += bool(set(sys._current_frames()) - ours)
        time.sleep(0.05)
print(json.dumps(hits), flush=True)
"""


def _channel(tmp: Path) -> Path:
    wheel = tmp / "racepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("racepkg/__init__.py", "")
        z.writestr("racepkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: racepkg\nVersion: 1.0\n")
        z.writestr("racepkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("racepkg-1.0.dist-info/RECORD", "")
    channel = tmp / "channel"
    from build_tools.packagers import conda
    conda.wheel_to_conda(wheel, channel, name="racepkg", progress=lambda *_: None)
    return channel


def test_rattler_calls_return_with_no_thread_left_in_python(tmp_path):
    channel = _channel(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CHILD, str(channel), "30"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert json.loads(p.stdout) == {"index": 0, "query": 0, "solve": 0}, p.stdout
    assert (channel / "linux-64" / "repodata.json").is_file()


def test_wait_returns_when_a_foreign_thread_leaves_python():
    from build_tools.packagers import conda
    started, left = threading.Event(), threading.Event()

    def body(seconds):  # a thread that threading does not know of, like rattler's tokio threads
        started.set()
        time.sleep(seconds)
        left.set()

    _thread.start_new_thread(body, (0.3,))
    assert started.wait(5)
    assert conda._foreign_threads_in_python()
    assert conda._wait_foreign_threads_out_of_python(timeout=10) is True
    assert left.is_set()
    assert not conda._foreign_threads_in_python()


def test_wait_gives_up_after_its_timeout():
    from build_tools.packagers import conda
    started, left = threading.Event(), threading.Event()

    def body():
        started.set()
        time.sleep(1.5)
        left.set()

    _thread.start_new_thread(body, ())
    assert started.wait(5)
    t0 = time.monotonic()
    assert conda._wait_foreign_threads_out_of_python(timeout=0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 1.4 and not left.is_set()
    assert left.wait(10)
    assert conda._wait_foreign_threads_out_of_python(timeout=10) is True
