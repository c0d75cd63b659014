"""The program's standard output: a failure to write it ends the command like any other error, never a traceback.

- A reader that went away (``hfcache ls --json | head -c 100``): exit 141, silently, what a shell reports for a
  program ended by SIGPIPE (``git log | head``). click and rich would exit 1 there (click.core ``main`` and rich
  ``Console.on_broken_pipe``), which reads as "a check failed"; and SIGPIPE itself cannot be left at its default
  (Python's advice, the ``signal`` module's "Note on SIGPIPE"): a socket closed by a Hub would then kill a download.
- Any other write error (a full disk, ``> /dev/full``; a closed descriptor, ``>&-``): one ``hfcache: error:`` line
  on stderr and exit 5 (a filesystem problem, docs/cli.md).

After either, file descriptor 1 is pointed at ``/dev/null``, so that flushes of buffered output on the way out write
nowhere instead of failing again. Standard library only; installed by :func:`hfcache.cli.main.run`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from typing import Any, NoReturn

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
EXIT_OUTPUT_FAILED = 5  # CacheError.exit_code: the filesystem refused the output
_reported = False  # the error line has been printed


class GuardedStdout:
    """``sys.stdout`` for the program: writes and flushes go to ``stream`` (and ``buffer`` to its binary buffer, as
    ``export -`` writes a tar); an OSError ends the command (module docstring) by raising SystemExit, which click and
    rich let through. ``started`` tells whether anything was written: a document already begun is not followed by
    an error document (:func:`hfcache.cli.main._fail`)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream if stream is not None else _Closed()
        self.started = False

    def write(self, data: Any) -> int:
        self.started = self.started or bool(data)
        try:
            return self._stream.write(data)
        except OSError as exc:
            output_failed(exc)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            output_failed(exc)

    @property
    def buffer(self) -> GuardedStdout:
        binary = self.__dict__.get("_binary")
        if binary is None:
            binary = self.__dict__["_binary"] = _GuardedBuffer(self)
        return binary

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno...: the real stream's
        return getattr(self._stream, name)


class _GuardedBuffer(GuardedStdout):
    """The binary side of :class:`GuardedStdout` (``sys.stdout.buffer``), sharing its ``started``."""

    def __init__(self, text: GuardedStdout) -> None:
        self._text = text
        self._stream = getattr(text._stream, "buffer", text._stream)

    @property
    def started(self) -> bool:  # type: ignore[override]
        return self._text.started

    @started.setter
    def started(self, value: bool) -> None:
        self._text.started = value


class _Closed(io.TextIOBase):
    """What ``sys.stdout`` is when descriptor 1 was closed (``>&-``: Python sets it to None); also its buffer."""

    def write(self, data: Any) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


def _to_devnull() -> None:
    """Point descriptor 1 at ``/dev/null``: later writes and flushes go nowhere instead of failing or waiting."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def output_failed(exc: OSError) -> NoReturn:
    """End the command after ``exc`` writing stdout: 141 for a reader gone, else one error line and exit 5."""
    _to_devnull()
    global _reported
    if isinstance(exc, BrokenPipeError):
        raise SystemExit(EXIT_BROKEN_PIPE)
    if _reported:  # a later write on the way out (a tar's trailer, a final flush): said once already
        raise SystemExit(EXIT_OUTPUT_FAILED)
    _reported = True
    with contextlib.suppress(Exception):
        sys.stderr.write(f"hfcache: error: cannot write to standard output: {exc.strerror or exc}\n"
                         "hint: redirect the output to a writable file (or /dev/null)\n")
        sys.stderr.flush()
    raise SystemExit(EXIT_OUTPUT_FAILED)


def abandon_if_blocked(stream: Any) -> bool:
    """On Ctrl-C or SIGTERM: when stdout holds part of a document, or its reader is not reading (a write would
    wait), point it at ``/dev/null``: no second document glued to a truncated one, no flush that waits (not
    ``O_NONBLOCK``: that flag belongs to the open file description, shared with the shell, and would outlive us).
    Returns True when stdout was abandoned (print no error document then)."""
    import select

    started = getattr(stream, "started", False)
    try:
        writable = bool(select.select([], [1], [], 0)[1])
    except (OSError, ValueError):
        writable = False
    if started or not writable:
        _to_devnull()
    return started or not writable
