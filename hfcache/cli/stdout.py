"""The program's standard output: a failure to write it ends the command, never a traceback (docs/cli.md: a reader
gone exits 141 silently, as a shell reports SIGPIPE, which itself stays ignored; any other write error exits 5 with
one error line). Descriptor 1 then points at ``/dev/null``. Installed by :func:`hfcache.cli.main.run`.
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
    """``sys.stdout`` for the program (``buffer``: its binary side, ``export -``'s tar): an OSError ends the command
    with SystemExit (click and rich let it through); ``started``: anything was written (no error document then)."""

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
        if (binary := self.__dict__.get("_binary")) is None:
            binary = self.__dict__["_binary"] = _GuardedBuffer(self)
        return binary

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno...: the real stream's
        return getattr(self._stream, name)


class _GuardedBuffer(GuardedStdout):
    """``sys.stdout.buffer``, sharing :class:`GuardedStdout`'s ``started``."""

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
    """``sys.stdout`` when descriptor 1 was closed (``>&-``: Python sets it to None)."""

    def write(self, data: Any) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


def _to_devnull() -> None:
    """Point descriptor 1 at ``/dev/null``: later writes go nowhere instead of failing or waiting."""
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
    """On Ctrl-C or SIGTERM: point stdout at ``/dev/null`` when it holds part of a document or its reader is not
    reading (not ``O_NONBLOCK``: the shell shares that flag); True when abandoned (no error document then)."""
    import select

    started = getattr(stream, "started", False)
    try:
        writable = bool(select.select([], [1], [], 0)[1])
    except (OSError, ValueError):
        writable = False
    if started or not writable:
        _to_devnull()
    return started or not writable
