"""The benchmarks' records: one JSON line per run in ``records/<benchmark>.jsonl`` (run id,
date, commit, machine, torch, configuration, every counter), from which each benchmark
rewrites its ``RESULTS-<benchmark>.md``; nobody copies figures by hand.

Runs before the records existed (an older numbering, runs 7-172, whose raw logs and README
files were once kept in the tree in run folders) were converted once: their machine-readable
results went into the benchmark's records with ``source`` naming the old folder, and each
folder's README (what the run claims, in prose) into ``records/runs.jsonl`` as ``notes``.
The later runs' ids reach that range from 170 on; a record's commit and ``source`` tell the
two apart.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess

import device_cap

HERE = pathlib.Path(__file__).resolve().parent
RECORDS = HERE / "records"


def commit() -> str:
    """LMS_COMMIT, else the checkout's short hash, else "unknown"."""
    if os.environ.get("LMS_COMMIT"):
        return os.environ["LMS_COMMIT"]
    try:
        q = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                           capture_output=True, text=True, timeout=20)
        if q.returncode == 0 and q.stdout.strip():
            return q.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return "unknown"


def machine() -> dict:
    info = {"host": platform.node(), "python": platform.python_version()}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        info["gpu"] = "; ".join(dict.fromkeys(q.stdout.strip().splitlines())) or None
    except Exception:  # noqa: BLE001
        pass
    if device_cap.gib() is not None:
        info["device_gib"] = round(device_cap.gib(), 2)
        info["device_hold"] = device_cap.hold()
    return info


def gpu_label(machine: dict) -> str:
    """A record's card for a table: its name, and the size its run was held to where the
    run was capped (device_cap)."""
    gpu = (machine or {}).get("gpu") or "?"
    size = (machine or {}).get("device_gib")
    if size:
        gpu += f", held to {size:.1f} GiB"
        if abs(size - device_cap.H100_GIB) < 0.05:
            gpu += " (an H100's size)"
        if (machine or {}).get("device_hold") == "ballast":
            gpu += " by a ballast"
    return gpu


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def header(run=None) -> dict:
    """The fields every new record starts with (run id from LMS_RUN where given; torch
    None where it is not installed, as on a TensorFlow suite's runner)."""
    try:
        import torch
        version = torch.__version__
    except ImportError:
        version = None
    return {"run": run or os.environ.get("LMS_RUN"), "date": today(), "commit": commit(),
            "machine": machine(), "torch": version}


def append(path, record: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load(path) -> list:
    return [json.loads(x) for x in open(path) if x.strip()]


def title(r: dict) -> str:
    """A record's heading: run, date, commit, machine, where it came from."""
    gpu = gpu_label(r.get("machine"))
    bits = [f"run {r['run']}" if r.get("run") else "run (no id)", r.get("date") or "date unknown",
            f"commit {r.get('commit') or 'unknown'}", gpu]
    if r.get("torch"):
        bits.append(f"torch {r['torch']}")
    if r.get("source"):
        bits.append(f"folder `{r['source']}`")
    return ", ".join(bits)


def by_commit(recs) -> list:
    """(commit, its records) pairs, the commit of the newest record first."""
    key = [r.get("commit") or "unknown" for r in recs]
    return [(c, [r for r, k in zip(recs, key) if k == c]) for c in dict.fromkeys(reversed(key))]


def cell(x) -> str:
    """A value as one markdown table cell."""
    return "-" if x is None or x == "" else str(x).replace("|", "/").replace("\n", " ")


def write_by_commit(path, recs, head: list, columns: list, rows, note) -> None:
    """Rewrite the table ``path``: ``head`` (lines), then a section per commit, the newest
    first: ``## Commit <c>``, ``note(its records)``, and the table of ``rows(its records)``
    (lists of cells) under ``columns`` (names). Every RESULTS-*.md grouped by commit comes
    from here."""
    lines = list(head)
    for c, group in by_commit(recs):
        lines += ["", f"## Commit {c}", "", note(group), "",
                  "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in rows(group)]
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def cut_by_timeout(r: dict, unit: str) -> str:
    """A table's words for a run the harness's timeout cut: its limit and how far it got,
    "timeout (286 s) after 28 of 30 iterations (the last took 7.5 s)" (not the child's last
    printed line), or "cut by the run's time budget (37 s left) after ..." where what was
    left of the whole run's budget, not the per-run timeout, was its limit
    (``cut_by_budget``); "" for a run that ended any other way."""
    m = re.match(r"timeout \(([\d.]+) ?s\)", str(r.get("status", "")))
    if not m:
        return ""
    limit = float(m.group(1))
    words = (f"cut by the run's time budget ({limit:.0f} s left)" if r.get("cut_by_budget")
             else f"timeout ({limit:.0f} s)")
    return words + how_far(r, unit)


def how_far(r: dict, unit: str) -> str:
    """" after 28 of 30 iterations (the last took 7.5 s)": how far a run that did not
    finish got, from the step times its harness kept."""
    seen = r.get("step_s_seen") or []
    asked = f" of {r['steps_asked']}" if r.get("steps_asked") else ""
    return (f" after {r.get('steps_done', len(seen))}{asked} {unit}"
            + (f" (the last took {seen[-1]:.1f} s)" if seen else ""))


TRACE_KEYS = ("run", "date", "commit", "source", "part")


def traces_path(path) -> pathlib.Path:
    """Where the per-step traces of ``records/<name>.jsonl`` go: ``<name>-per-step.jsonl.gz``."""
    path = pathlib.Path(path)
    return path.with_name(path.stem + "-per-step.jsonl.gz")


def split_traces(record: dict, field: str = "per_step") -> list:
    """Take each result's ``field`` (a counter line per step, which no table reads) out of
    ``record``; return the lines for ``traces_path``: the record's run, date, commit and
    source, the result's index, model, scale, batch and mode, and the trace."""
    out = []
    for i, res in enumerate(record.get("results") or []):
        if isinstance(res, dict) and field in res:
            out.append({**{k: record.get(k) for k in TRACE_KEYS if k in record}, "result": i,
                        **{k: res.get(k) for k in ("model", "scale", "batch", "mode")},
                        field: res.pop(field)})
    return out


def split_row_traces(row: dict, fields=("steps", "steps_seen"),
                     keys=("loop", "scale", "batch", "mode")) -> list:
    """The same for a record that is one configuration's row (the loops bench's): take its
    ``fields`` (counter lines per iteration) out of ``row``; return the one line for
    ``traces_path`` (its run, date, commit and source, ``keys``, the traces), or none."""
    taken = {f: row.pop(f) for f in fields if f in row}
    if not taken:
        return []
    return [{**{k: row.get(k) for k in TRACE_KEYS if k in row},
             **{k: row.get(k) for k in keys}, **taken}]


def append_with_traces(path, record: dict, split=split_traces) -> None:
    """Append ``record`` to ``path`` and its per-step traces (``split`` takes them out of
    it), gzipped, beside it."""
    import gzip
    lines = split(record)
    if lines:
        with gzip.open(traces_path(path), "at") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
    append(path, record)


def load_traces(path) -> list:
    """The per-step traces kept beside ``records/<name>.jsonl`` (none: [])."""
    import gzip
    p = traces_path(path)
    return [json.loads(x) for x in gzip.open(p, "rt") if x.strip()] if p.exists() else []
