"""A build as a list of steps: printed exactly by --dry-run, executed otherwise."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..buildlock import build_lock
from ..errors import LmsError
from ..progress import info, step
from ..tools import tool_env
from ..toolchain import Check


@dataclass
class Step:
    title: str
    command: list[str] | None = None        # a command run in `cwd` with `env` added
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    action: Callable[[], None] | None = None  # or Python work (fetch, apply, repack)
    shows: list[str] = field(default_factory=list)  # for an action: the commands it amounts to
    tree: bool = False  # the step that leaves the patched tree in the build folder (--tree-only ends there)

    def render(self) -> str:
        if self.command is None:
            return "\n".join([f"# {self.title}", *self.shows])
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd else ""
        return f"# {self.title}\n{cd}{env + ' ' if env else ''}{shlex.join(self.command)}"


@dataclass
class Plan:
    title: str
    steps: list[Step]
    checks: list[Check]
    log: Path
    notes: list[str] = field(default_factory=list)   # what the user must know before running it
    outputs: dict = field(default_factory=dict)       # what its steps made, by name ("wheel"), once run

    def render(self) -> str:
        out = [f"Plan: {self.title}", ""]
        if self.notes:
            out += ["Notes:"] + [f"  - {n}" for n in self.notes] + [""]
        out += ["Toolchain:"]
        out += [f"  {c.line()}" for c in self.checks]
        out += ["", "Steps:"]
        for i, s in enumerate(self.steps, 1):
            out += [f"  [{i}] " + s.render().replace("\n", "\n      ")]
        return "\n".join(out)

    def until_tree(self) -> "Plan":
        """This plan up to and including the step that prepares the patched tree, with no toolchain
        to check: the tree a build would compile, made in the build folder under its lock."""
        ends = [i for i, s in enumerate(self.steps) if s.tree]
        if not ends:
            raise LmsError(f"{self.title}: no step of this plan prepares a tree")
        return Plan(f"{self.title} (tree only)", self.steps[:ends[0] + 1], [], self.log, list(self.notes),
                    self.outputs)

    def execute(self) -> None:
        for n in self.notes:
            info(f"note: {n}")
        missing = [c for c in self.checks if not c.ok]
        if missing:
            raise LmsError("the toolchain for this build is incomplete:\n  " +
                           "\n  ".join(c.line() for c in missing),
                           hint="install what is listed, or `--dry-run` to see the whole plan")
        folder = self.log.parent
        # one build at a time in this build folder (a second one waits), each with its own log
        with build_lock(folder, self.title):
            self.log = self._run_log(folder)
            info(f"log: {self.log}")
            for i, s in enumerate(self.steps, 1):
                step(f"[{i}/{len(self.steps)}] {s.title}")
                start = time.monotonic()
                if s.action is not None:
                    s.action()
                if s.command is not None:
                    run_logged(s.command, s.cwd, s.env, self.log)
                info(f"done in {time.monotonic() - start:.0f}s")

    def _run_log(self, folder: Path) -> Path:
        """logs/<time>-<pid>.log in the build folder; build.log beside them names the latest."""
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        log.write_text(f"# {self.title}\n")
        latest = folder / f".{self.log.name}.{os.getpid()}"
        latest.unlink(missing_ok=True)
        latest.symlink_to(log.relative_to(folder))
        os.replace(latest, folder / self.log.name)
        return log


def run_logged(cmd: list[str], cwd: Path | None, env: dict, log: Path) -> None:
    """Run, streaming output to stderr and appending it to `log`; a failure shows the log's tail."""
    full = tool_env(dict(os.environ, **env))  # tools setup put in the venv, for the build's own lookups
    with log.open("a") as lf:
        lf.write(f"\n$ {shlex.join(cmd)}\n")
        lf.flush()
        try:
            p = subprocess.Popen(cmd, cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise LmsError(f"could not start {cmd[0]}: {e}") from None
        tail: list[str] = []
        for line in p.stdout:
            lf.write(line)
            sys.stderr.write(line)
            tail = (tail + [line])[-30:]
        rc = p.wait()
    if rc != 0:
        raise LmsError(f"`{shlex.join(cmd)}` failed with exit status {rc}; last lines:\n" + "".join(tail),
                       hint=f"full log: {log}")
