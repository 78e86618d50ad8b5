"""The benchmark parents' side: each configuration runs as a child process in its own
session, with a timeout and a host-memory guard, and a stop of the parent ends it.

A crash, a CUDA OOM or the kernel's OOM killer then ends only that configuration, and a
child never outlives its parent holding GPU memory.  Children report with lines
``RESULT {json}`` (one per process: a torchrun job prints one per rank) and may print
``STEP {json}`` per step, which are kept for a child that did not finish.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

_RUNNING = set()  # process groups of the children now running
_STOP: List[int] = []  # the signal that told the parent to stop, once one did


class Stopped(SystemExit):
    """The parent was told to stop while a child ran: exits with 128 + the signal, and
    carries what the child had done (``result``: a status that says so, the steps it
    printed) for the caller to record before it goes."""

    def __init__(self, signum: int, result: dict) -> None:
        super().__init__(128 + signum)
        self.result = result


def meminfo(key: str) -> Optional[int]:
    """A field of /proc/meminfo in bytes (``MemAvailable``, ``MemTotal``)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def mem_available() -> Optional[int]:
    return meminfo("MemAvailable")


def peak_rss() -> Optional[int]:
    """This process's resident-set high-water mark (bytes)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _end_children(signum, _frame):
    """The parent was told to stop (a timeout around it, Ctrl-C): end the running
    child too.  Each child has its own session, so the signal does not reach it, and
    a child left behind keeps its GPU memory: on the H100 one ran on after its parent
    was killed and the next configuration died of CUDA OOM with 0.8 GiB of its own.
    Where a child was running, the parent's watch over it sees it gone and raises
    :class:`Stopped` with what it had done (a cut run still leaves its record)."""
    _STOP.append(signum)
    running = list(_RUNNING)
    for pgid in running:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not running:
        raise SystemExit(128 + signum)


def stopping() -> bool:
    """Whether the parent has been told to stop (by a signal its handlers caught)."""
    return bool(_STOP)


def install_stop_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _end_children)


def run_process(cmd: List[str], timeout: float, guard_bytes: int, log,
                env: Optional[Dict[str, str]] = None,
                on_result: Optional[Callable[[dict], None]] = None) -> dict:
    """Runs ``cmd`` in its own session; its output goes to ``log``.  Returns the last
    ``RESULT`` it printed (all of them under ``results``), or a status saying why there
    is none, with ``wall_s``, ``min_mem_available`` and ``returncode``.

    ``on_result(result)`` runs as soon as the result is known: for a child that was
    killed, before its exit, which can take many seconds (on the H100 a child that had
    pinned 70 GB of host memory outlasted the 15 s an outer timeout left its parent, and
    the parent died waiting, its record unwritten)."""
    if _STOP:  # told to stop between two children: start no other
        raise SystemExit(128 + _STOP[0])
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env)
    _RUNNING.add(p.pid)
    try:
        res = _watch(p, t0, timeout, guard_bytes, log)
        if on_result is not None:
            on_result(res)
        if _STOP:
            raise Stopped(_STOP[0], res)
        return res
    finally:
        try:  # the child, and what its session still holds (torchrun's workers)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            # the next child may start only once this one's memory is back; a parent
            # that is stopping starts none, and init reaps what it leaves
            p.wait(timeout=2 if _STOP else None)
        except subprocess.TimeoutExpired:
            pass
        _RUNNING.discard(p.pid)


def finished_before_cut(r: dict, key: str, value) -> dict:
    """The child's own result where the harness's timeout (or a stop of the benchmark) cut
    it after it printed that result (while the process was exiting, which takes seconds
    for one that pinned tens of GB): every step it was asked for ran, so the run is a
    result, marked ``cut_after_result``; else ``r`` as it came.  Its result is the last of
    ``r["results"]`` whose ``key`` is ``value`` (a configuration's loop or model)."""
    done = [x for x in r.pop("results", None) or [] if x.get(key) == value]
    if not (str(r.get("status", "")).startswith(("timeout", "stopped")) and done):
        return r
    out = dict(done[-1])
    out.update({k: r[k] for k in ("wall_s", "min_mem_available", "returncode") if k in r})
    out["cut_after_result"] = r["status"]
    return out


def _records(lines: List[str], tag: str) -> List[dict]:
    """The JSON records of the lines that start with ``tag`` (a line garbled by two
    processes writing at once is skipped, not fatal to the parent)."""
    out = []
    for line in lines:
        if line.startswith(tag):
            try:
                out.append(json.loads(line[len(tag):]))
            except ValueError:
                pass
    return out


def _watch(p, t0, timeout, guard_bytes, log) -> dict:
    min_avail = mem_available()
    killed = None
    out_lines: List[str] = []

    def reader():
        for line in p.stdout:
            out_lines.append(line)
            log.write(line)
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    while p.poll() is None and not _STOP:
        time.sleep(0.1)
        avail = mem_available()
        if avail is not None:
            min_avail = min(min_avail, avail)
            if avail < guard_bytes:
                killed = "killed (host memory)"
                os.killpg(p.pid, signal.SIGKILL)
                break
        if time.perf_counter() - t0 > timeout:
            killed = f"timeout ({timeout}s)"
            os.killpg(p.pid, signal.SIGKILL)
            break
    if _STOP:
        killed = f"stopped with the benchmark (signal {_STOP[0]})"
    if killed:
        # what it printed is read as it came; its exit, and the end of its output,
        # may be seconds away (see run_process)
        th.join(timeout=2)
    else:
        p.wait()
        th.join(timeout=5)
    wall = time.perf_counter() - t0
    results = _records(out_lines, "RESULT ")
    if results and (not killed or killed.startswith("stopped")):
        # a child that printed its result had finished its work: a stop that reaches
        # it while it exits (a child that pinned tens of GB takes seconds) costs
        # nothing of it
        res = dict(results[-1])
        res["results"] = results
        if killed:
            res["stopped_after_result"] = killed
    else:
        steps = _records(out_lines, "STEP ")
        res = {"status": killed or f"exit {p.returncode}",
               "error": "".join(out_lines[-5:])[-400:],
               "steps_done": len(steps),  # of a run that did not finish
               "step_s_seen": [s["s"] for s in steps],
               # every record it printed, counters included: where a cut run lost its
               # time is in them
               "steps_seen": steps,
               "results": results}
    res["wall_s"] = round(wall, 1)
    res["min_mem_available"] = min_avail
    res["returncode"] = p.poll()
    return res


# ------------------------------------- what the configurations load, compiled first
COMPILE_FLAG = "--compile"  # the child's flag: --compile net|allocator, one RESULT
COMPILED = ("net", "allocator")  # lms_swap_loader.compile_net / compile_allocator


def add_compile_option(ap) -> None:
    """A parent's ``--compile-s`` and its children's (hidden) ``--compile WHAT``."""
    import argparse
    ap.add_argument(COMPILE_FLAG, choices=COMPILED, help=argparse.SUPPRESS)
    ap.add_argument("--compile-s", type=float, default=300.0, metavar="SECONDS",
                    help="time for compiling, once and before the configurations, what they "
                         "load: the eviction net (modes with lms_swap) and the pluggable "
                         "allocator (the pluggable modes); they then find it compiled (0: the "
                         "first such configuration compiles it, inside its time limit)")


def compile_child(what: str) -> int:
    """What a child given ``--compile WHAT`` does: compile it, print its one RESULT."""
    from lms_swap_loader import compile_allocator, compile_net
    print("RESULT " + json.dumps(compile_net() if what == "net" else compile_allocator()),
          flush=True)
    return 0


def compile_first(whats: Sequence[str], seconds: float, left: Callable[[], float],
                  run: Callable[[str, float], dict]) -> Dict[str, dict]:
    """Each of ``whats`` (the net, the allocator: scale_plan.compiled) compiled once, by
    ``run(what, timeout)`` (a child given ``--compile WHAT``), before any configuration, so
    that no configuration's time limit or first step holds the compile (the net 45-70 s, the
    allocator 27 s on a fresh GPU machine).  Each gets ``seconds`` (the parent's
    ``--compile-s``; 0: none is compiled first), at most what ``left()`` says is left of the
    run's budget when it starts.  What each answered, printed and returned by name
    (``{WHAT: "ready", "s": ...}`` or ``{WHAT: "unavailable", "reason": ...}``)."""
    answers: Dict[str, dict] = {}
    for what in whats if seconds > 0 else ():
        r = run(what, min(seconds, left()))
        got = {k: r[k] for k in (what, "s", "reason") if k in r} or {
            what: "unavailable", "reason": str(r.get("status") or r.get("error"))[:500]}
        print(f"[{what}] {got[what]}" + (f" in {got['s']} s" if "s" in got else "")
              + (f": {got['reason']}" if "reason" in got else ""), flush=True)
        answers[what] = got
    return answers
