"""What every command's rendering shares: the two consoles (``stdout``, ``stderr``, made on first use), one JSON
document, error lines, sizes and times. A result goes to stdout (``| grep`` works), progress, notices and errors to
stderr."""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from ...units import human_size

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["Bar", "ago", "human_size", "inert", "iso_time", "live_on_terminal", "lock_wait_notice", "print_error",
           "print_json", "table", "usage_hint", "warn"]

# Off a terminal rich assumes 80 columns and would wrap long ids and paths, breaking `| grep`; a table is only as wide
# as its content, so a generous width keeps each row on one line. COLUMNS, when set, still wins.
PIPE_WIDTH = 1000
_consoles: dict[bool, Console] = {}


def _console(*, to_stderr: bool) -> Console:
    # Built on first use: `warm --lock --json` on a complete cache never loads rich (docs/benchmarks.md, goal P1).
    if (console := _consoles.get(to_stderr)) is None:
        Console = _inert_console_class()

        # markup=False: a plain string is text, never rich markup (a cache path '/tmp/a[/b]' was a MarkupError,
        # exit 70, and a hint "pip install 'hfcache[check]'" lost its "[check]"); styles are given as Text/styles
        console = Console(stderr=to_stderr, highlight=False, markup=False)
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(stderr=to_stderr, highlight=False, markup=False, width=PIPE_WIDTH)
        _consoles[to_stderr] = console
    return console


def _inert_console_class() -> type[Console]:
    """A rich ``Console`` whose output text passes :func:`inert` (line breaks kept; rich's own styles untouched),
    hooked at ``render_str`` (before strings are measured) and ``render`` (every segment; escaping is idempotent)."""
    from rich.console import Console
    from rich.segment import Segment

    def keep_lines(text: str) -> str:
        return text if text.isprintable() else "\n".join(inert(part) for part in text.split("\n"))

    class InertConsole(Console):
        def render_str(self, text: str, **kwargs):  # type: ignore[override]
            # Escaped before rich measures it: a column is as wide as what is shown.
            return super().render_str(keep_lines(text), **kwargs)

        def render(self, renderable, options=None):  # type: ignore[override]
            for segment in super().render(renderable, options):
                text = segment.text
                if segment.control or text.isprintable() or text == "\n":
                    yield segment
                else:
                    yield Segment(keep_lines(text), segment.style)

    return InertConsole


def _stderr() -> Console:
    return _console(to_stderr=True)


def __getattr__(name: str) -> Any:
    # ``stderr`` and ``stdout`` (rich Consoles) are made when first asked for (PEP 562), so importing this is cheap:
    # use them as ``common.stdout`` at call time, never ``from .common import stdout`` (that would build it).
    if name in ("stderr", "stdout"):
        return _console(to_stderr=name == "stderr")
    raise AttributeError(name)


def live_on_terminal(enabled: bool) -> bool:
    """Whether a transient progress display should run: only on a terminal (rich writes cursor controls anyway)."""
    return enabled and _stderr().is_terminal


def table(title: str, columns: Iterable[str], right: Collection[str] = (), caption: str | None = None,
          **options: Any) -> Table:
    """A rich Table titled ``title`` (and ``caption``) with ``columns``, those in ``right`` right-justified;
    ``options`` go to every ``add_column``."""
    from rich.table import Table

    made = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for column in columns:
        made.add_column(column, justify="right" if column in right else "left", **options)
    return made


class Bar:
    """A context manager: one transient rich progress bar of ``total`` with ``columns`` on stderr, on a terminal."""

    def __init__(self, enabled: bool, total: int, *columns: Any) -> None:
        from rich.progress import Progress

        self._progress = Progress(*columns, console=_stderr(), disable=not live_on_terminal(enabled), transient=True)
        self._task = self._progress.add_task("", total=total)

    def __enter__(self) -> Any:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def start(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def advance(self, n: int) -> None:
        self._progress.advance(self._task, n)


def lock_wait_notice(wait: Any) -> None:
    """``on_lock_wait``: which lock a command waits for (a :class:`hfcache.cache.locking.LockWait`), on stderr."""
    from rich.text import Text

    holder = f", held by {wait.holder}" if wait.holder else ""
    _stderr().print(Text(f"hfcache: waiting for the lock {wait.path}{holder} (gives up after {wait.timeout:g}s: "
                      "--lock-timeout)", style="yellow"), soft_wrap=True)


def print_json(document: Any, *, compact: bool = False) -> None:
    """Print one JSON document on stdout (sorted keys, trailing newline; two-space indent unless ``compact``)."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":")) if compact else json.dumps(
        document, indent=2, sort_keys=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def inert(text: str) -> str:
    """``text`` as one inert line for a terminal: every character ``str.isprintable`` refuses escaped as
    ``\\xNN``/``\\uNNNN``, so what a peer or cache supplied cannot move the cursor or print a line of its own."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def warn(line: str, prefix: str = "warning: ", soft_wrap: bool = True) -> None:
    """One yellow line on stderr: ``prefix`` then ``line`` (through :func:`inert`)."""
    from rich.text import Text

    _stderr().print(Text(f"{prefix}{inert(line)}", style="yellow"), soft_wrap=soft_wrap)


def usage_hint(exit_code: int, command: str, hint: str | None = None) -> str | None:
    """``hint``, else for a usage error (exit 2) where ``command`` (``hfcache warm``) explains its usage."""
    return hint or (f"see `{command} --help`" if exit_code == 2 else None)


def print_error(message: str, hint: str | None = None) -> None:
    """One or two lines on stderr: what failed, and what to do (both through :func:`inert`)."""
    from rich.text import Text

    _stderr().print(Text(f"hfcache: error: {inert(message)}", style="bold red"), soft_wrap=True)
    if hint:
        _stderr().print(Text(f"hint: {inert(hint)}", style="yellow"), soft_wrap=True)


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
