"""The README as users and CI read it: its first code block is the two fresh-machine commands
(what ../shared/fresh-machine-check runs, and .ci/run's `make test`); its first screen carries the
install line and the three lines of use, which run as written; no commit hashes or run numbers
above the settings; every relative link in README.md and docs/ leads to a file and heading that
exist; the speed table's figures are those of the benchmark table it cites."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINES = README.splitlines()
TWO_COMMANDS = ["make setup build TORCH=v2.6.0 MODE=overlay SOURCE=debian", "make test"]


def _blocks(lines):
    """Fenced code blocks as (first line number, info string, body lines)."""
    out, cur = [], None
    for n, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            if cur is None:
                cur = (n, line.strip()[3:].strip(), [])
            else:
                out.append(cur)
                cur = None
        elif cur is not None:
            cur[2].append(line)
    return out


def test_the_first_code_block_is_the_two_fresh_machine_commands():
    # the same reading as fresh-machine-check: lines between the first two ``` lines, blank ones dropped
    n = 0
    first = []
    for line in LINES:
        if line.startswith("```"):
            n += 1
            continue
        if n == 1 and line.strip():
            first.append(line)
    assert first == TWO_COMMANDS
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"exec bash .ci/clean_root.sh {TWO_COMMANDS[1]}" in ci and f"exec {TWO_COMMANDS[1]}" in ci


def test_the_first_screen_has_pip_install_and_three_lines_of_use():
    screen = LINES[:40]
    assert any("pip install ./lms-swap" in l for l in screen)
    python = [b for b in _blocks(screen) if b[1] == "python"]
    assert python, "no python block in the first 40 lines"
    body = [l for l in python[0][2] if l.strip()]
    assert len(body) == 3 and body[0] == "import lms_swap", body


def test_the_three_lines_of_use_swap_and_keep_gradients(tmp_path):
    use = "\n".join(l for l in [b for b in _blocks(LINES[:40]) if b[1] == "python"][0][2] if l.strip())
    # a CPU machine: the same lines, with the swapper told to treat CPU tensors as its device and
    # to swap every one, so they do real work here; gradients must equal a run without swapping
    script = f"""
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
x = torch.randn(32, 64)
def train(m):
    m.zero_grad()
    m(x).pow(2).sum().backward()
    return [p.grad.clone() for p in m.parameters()]
ref = train(model)
import lms_swap
lms_swap.configure(device_type="cpu", policy="always", size_threshold=1024,
                   host_limit=64 << 20, host_min_available=0)
{use}
got = [p.grad.clone() for p in model.parameters()]
assert lms_swap.is_enabled()
assert all(torch.equal(a, b) for a, b in zip(ref, got))
print("swapped", lms_swap.stats()["swap.out_count"])
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lms-swap" / "src")}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout.split()[-1]) > 0, p.stdout


def test_no_commit_hashes_or_run_numbers_above_the_settings():
    fold = README[:README.index("\n## Settings")]
    assert fold.count("\n") >= 40
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", fold) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not hashes
    assert not re.search(r"\bruns? \d+|\brun-\d+|runs-\d+", fold, re.IGNORECASE)


def _slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = md.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_relative_links_in_readme_and_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {p.name for p in pages} >= {"README.md", "architecture.md", "status.md"}
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: {target}"
            if anchor:
                assert anchor in _anchors(dest), f"{page.name}: {target}: no such heading"
            checked += 1
    assert checked >= 10


def test_the_speed_table_quotes_the_benchmark_table():
    bench = (ROOT / "examples" / "pytorch" / "benchmarks" / "README.md").read_text()
    zoo = [l for l in bench.splitlines() if l.startswith("| ") and "%" in l]
    assert "examples/pytorch/benchmarks/README.md" in README[:README.index("\n## Settings")]
    rows = re.findall(r"^\| (\d\.\d)x \| ([\d.]+)-([\d.]+)% of", README, re.M)
    assert [r[0] for r in rows] == ["1.0", "1.5", "2.0"]
    for scale, lo, hi in rows:
        col = {"1.0": 2, "1.5": 4, "2.0": 5}[scale]  # the zoo table's columns for each scale
        cells = [l.split(" | ")[col] for l in zoo if l.count(" | ") >= 6 and not l.startswith("| model")]
        values = [float(v) for c in cells for v in re.findall(r"\*\*(?:>= )?([\d.]+)%?\*\*", c)]
        assert values, scale
        assert (float(lo), float(hi)) == (min(values), max(values)), (scale, values)
