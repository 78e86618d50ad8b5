"""The benchmarks' records: one JSON line per run in ``records/<benchmark>.jsonl`` (run id,
date, commit, machine, torch, configuration, every counter), from which each benchmark
rewrites its ``RESULTS-<benchmark>.md``; nobody copies figures by hand.

Runs before the records existed (runs 7-172, whose raw logs and README files were once kept in the tree in run folders) were
converted once: their machine-readable results went into the benchmark's records with
``source`` naming the old folder, and each folder's README (what the run claims, in prose)
into ``records/runs.jsonl`` as ``notes``.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess

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
    return info


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def header(run=None) -> dict:
    """The fields every new record starts with (run id from LMS_RUN where given)."""
    import torch
    return {"run": run or os.environ.get("LMS_RUN"), "date": today(), "commit": commit(),
            "machine": machine(), "torch": torch.__version__}


def append(path, record: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load(path) -> list:
    return [json.loads(x) for x in open(path) if x.strip()]


def title(r: dict) -> str:
    """A record's heading: run, date, commit, machine, where it came from."""
    gpu = (r.get("machine") or {}).get("gpu") or "?"
    bits = [f"run {r['run']}" if r.get("run") else "run (no id)", r.get("date") or "date unknown",
            f"commit {r.get('commit') or 'unknown'}", gpu]
    if r.get("torch"):
        bits.append(f"torch {r['torch']}")
    if r.get("source"):
        bits.append(f"folder `{r['source']}`")
    return ", ".join(bits)
