"""What every command's rendering shares: the two consoles, one JSON document on stdout, error lines, and sizes
and times for people. ``NO_COLOR`` is honoured by rich.

The CLI convention (``git status``, ``pip list``, ``hf cache ls``): a command's result (its table, its summary line)
goes to ``stdout``, so that ``hfcache ls | grep bert`` works; progress, waits, notices and errors go to ``stderr``."""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ago", "human_size", "iso_time", "live_on_terminal", "lock_wait_notice", "print_error", "print_json",
           "stderr", "stdout"]

# Off a terminal (a pipe, a file, CI logs, docker build output) rich assumes 80 columns and would wrap every long
# repo id and path, breaking `| grep` and `| awk`. A table is only as wide as its content (rich tables do not expand),
# so a generous width keeps each row on one line without padding anything. COLUMNS, when set, still wins.
PIPE_WIDTH = 1000
_consoles: dict[bool, Console] = {}


def _console(*, to_stderr: bool) -> Console:
    # Built on first use, not at import: `warm --lock --json` on a complete cache never loads rich
    # (docs/benchmarks.md, goal P1).
    console = _consoles.get(to_stderr)
    if console is None:
        from rich.console import Console

        console = Console(stderr=to_stderr, highlight=False)
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(stderr=to_stderr, highlight=False, width=PIPE_WIDTH)
        _consoles[to_stderr] = console
    return console


def _stderr() -> Console:
    return _console(to_stderr=True)


def __getattr__(name: str) -> Any:
    # ``stderr`` and ``stdout`` (rich Consoles) are made when first asked for (PEP 562), so importing this is cheap:
    # use them as ``common.stdout`` at call time, never ``from .common import stdout`` (that would build it).
    if name in ("stderr", "stdout"):
        return _console(to_stderr=name == "stderr")
    raise AttributeError(name)


def live_on_terminal(enabled: bool) -> bool:
    """Whether a transient progress display should run: only on a terminal. Off one it would show nothing anyway,
    and rich still writes its cursor-restoring controls when it stops (a stray empty line in logs and pipes)."""
    return enabled and _stderr().is_terminal


def lock_wait_notice(wait: Any) -> None:
    """Tell the user on stderr which lock a command waits for, who holds it, and how long it will wait at most
    (a :class:`hfcache.cache.locking.LockWait`; the ``on_lock_wait`` callback of warm, prune, repair and import)."""
    from rich.text import Text

    holder = f", held by {wait.holder}" if wait.holder else ""
    _stderr().print(Text(f"hfcache: waiting for the lock {wait.path}{holder} (gives up after {wait.timeout:g}s: "
                      "--lock-timeout)", style="yellow"), soft_wrap=True)


def print_json(document: Any, *, compact: bool = False) -> None:
    """Print exactly one JSON document on stdout (sorted keys, trailing newline; two-space indent unless
    ``compact``, which large listings use: indenting 10,000 repos costs more than scanning them)."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":")) if compact else json.dumps(
        document, indent=2, sort_keys=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_error(message: str, hint: str | None = None) -> None:
    """One or two lines on stderr: what failed, and what to do."""
    from rich.text import Text

    _stderr().print(Text(f"hfcache: error: {message}", style="bold red"), soft_wrap=True)
    if hint:
        _stderr().print(Text(f"hint: {hint}", style="yellow"), soft_wrap=True)


def human_size(n: int | float) -> str:
    """1536 -> '1.5 KiB' (binary units, as ``du -h``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def iso_time(timestamp: float) -> str | None:
    """Seconds since the epoch -> ISO 8601 in UTC (None for 0: never)."""
    if not timestamp:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def ago(timestamp: float, now: float) -> str:
    """Humanised age: '42s ago', '3m ago', '5h ago', '12d ago'."""
    if not timestamp:
        return "never"
    seconds = max(0.0, now - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"
