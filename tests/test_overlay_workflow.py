"""The GPU-runner workflow (.github/workflows/lms-gpu.yml): valid YAML whose matrix covers every
supported framework x tag, on self-hosted GPU runners, calling make targets that exist, with
compiler caching configured and the conformance reports uploaded. (GitHub itself is not reachable
here: this checks the file, not a run.)"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
WF = REPO / ".github" / "workflows" / "lms-gpu.yml"


def load():
    data = yaml.safe_load(WF.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_matrix_covers_supported_tags():
    from build_tools import catalog
    wf = load()
    gpu = wf["jobs"]["gpu"]
    assert {"self-hosted", "gpu", "linux"} <= set(gpu["runs-on"])
    cells = {(c["framework"], c["tag"]) for c in gpu["strategy"]["matrix"]["include"]}
    for fw in ("pytorch", "tensorflow"):
        for tag in catalog.supported_tags(catalog.framework(fw)):
            assert (fw, tag) in cells, (fw, tag)
    assert gpu["strategy"]["fail-fast"] is False
    assert "workflow_dispatch" in wf["on"]


def test_steps_use_existing_make_targets_and_upload_reports():
    wf = load()
    make = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", make, re.M))
    runs = " ".join(s.get("run", "") for s in wf["jobs"]["gpu"]["steps"])
    used = set(re.findall(r"\bmake ([a-z][a-z-]*)", runs))
    assert {"build", "conformance", "setup"} <= used
    assert used <= targets, used - targets
    uploads = [s for s in wf["jobs"]["gpu"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    paths = " ".join(s["with"]["path"] for s in uploads)
    assert "build/conformance" in paths and "reports/" in paths


def test_compiler_cache_configured_for_both_modes():
    wf = load()
    env = wf["env"]
    assert env["LMS_COMPILER_LAUNCHER"] in ("ccache", "sccache")
    assert env["CCACHE_DIR"] and env["LMS_CACHE_DIR"]
    from build_tools.overlay import compiler_launcher
    assert compiler_launcher("none") is None
