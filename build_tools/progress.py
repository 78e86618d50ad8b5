"""Progress output for long work. Everything goes to stderr so that stdout stays parseable."""
import sys
import time


def step(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    print(f"    {message}", file=sys.stderr, flush=True)


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
