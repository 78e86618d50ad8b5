"""Progress output for long work. Everything goes to stderr so that stdout stays parseable."""
import codecs
import os
import queue
import subprocess
import sys
import threading
import time

__all__ = ["Counter", "Streamed", "info", "run_streamed", "step", "warn"]


def step(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    print(f"    {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"    warning: {message}", file=sys.stderr, flush=True)


class Counter:
    """Prints `label: n/total` at most every `every` seconds, and once at the end."""

    def __init__(self, label: str, total: int | None = None, unit: str = "", every: float = 2.0):
        self.label, self.total, self.unit, self.every = label, total, unit, every
        self.n = 0
        self._last = 0.0
        self._start = time.monotonic()

    def _fmt(self, n: float) -> str:
        if self.unit == "B":
            return f"{n / 2**20:.1f} MiB"
        return f"{int(n)}{self.unit}"

    def add(self, k: int = 1) -> None:
        self.n += k
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._print()

    def _print(self, final: bool = False) -> None:
        total = f"/{self._fmt(self.total)}" if self.total else ""
        tail = f" in {time.monotonic() - self._start:.1f}s" if final else ""
        print(f"    {self.label}: {self._fmt(self.n)}{total}{tail}", file=sys.stderr, flush=True)

    def done(self) -> None:
        self._print(final=True)


class Streamed:
    """What `run_streamed` saw: the exit status and everything the program printed."""

    def __init__(self, returncode: int, output: str):
        self.returncode, self.output = returncode, output

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_streamed(cmd, label: str, *, cwd=None, env=None, every: float | None = None, log=None,
                 out=None) -> Streamed:
    """Run `cmd` (stdout and stderr together) and keep the user informed while it runs.

    The program's own progress lines (git's "Receiving objects: 45% ...", ninja's "[12/150] ...",
    pip's "Downloading ...") are passed through as `    <label>: <line>`, at most one per `every`
    seconds (the latest one; every=0: all of them); when the program prints nothing for `every`
    seconds, a `<label>: still running after N s` line says it is alive. The last line is always
    shown, then how long it took. Lines git and pip redraw with a carriage return count as lines.
    `log`, an open text file, gets the whole output as it comes. `out` prints (default: stderr).
    The default period is $LMS_PROGRESS_EVERY seconds, else 10."""

    say = out or _say
    if every is None:
        try:
            every = float(os.environ.get("LMS_PROGRESS_EVERY", "10"))
        except ValueError:
            every = 10.0
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines: queue.Queue = queue.Queue()
    chunks: list[bytes] = []

    def read() -> None:
        pending = b""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = proc.stdout.read1(65536)
            if not data:
                break
            chunks.append(data)
            if log is not None:
                log.write(decoder.decode(data))
                log.flush()
            pending += data
            *done, pending = pending.replace(b"\r", b"\n").split(b"\n")
            for line in done:
                if line.strip():
                    lines.put(line.decode(errors="replace").strip())
        if pending.strip():
            lines.put(pending.decode(errors="replace").strip())
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def show(line: str) -> None:
        say(f"    {label}: {line if len(line) <= 160 else line[:157] + '...'}")

    last_shown = start - every  # the first line shows at once
    last_heard = start
    latest = None  # a line not shown yet
    while True:
        try:
            line = lines.get(timeout=min(1.0, every) if every > 0 else 1.0)
        except queue.Empty:
            line = ""
        now = time.monotonic()
        if line is None:
            break
        if line:
            latest, last_heard = line, now
        if latest is not None and now - last_shown >= every:
            show(latest)
            latest, last_shown = None, now
        elif latest is None and every > 0 and now - max(last_shown, last_heard) >= every:
            say(f"    {label}: still running after {now - start:.0f} s")
            last_shown = now
    reader.join()
    rc = proc.wait()
    if latest is not None:
        show(latest)
    took = time.monotonic() - start
    say(f"    {label}: {'done' if rc == 0 else f'failed (exit status {rc})'} in {took:.1f} s")
    return Streamed(rc, b"".join(chunks).decode(errors="replace"))
