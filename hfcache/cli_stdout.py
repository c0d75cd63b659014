"""The program's standard output: a failure to write it ends the command like any other error, never a traceback.

- A reader that went away (``hfcache ls --json | head -c 100``): exit 141, silently, what a shell reports for a
  program ended by SIGPIPE (``git log | head``). click and rich would exit 1 there (click.core ``main`` and rich
  ``Console.on_broken_pipe``), which reads as "a check failed"; and SIGPIPE itself cannot be left at its default
  (Python's advice, the ``signal`` module's "Note on SIGPIPE"): a socket closed by a Hub would then kill a download.
- Any other write error (a full disk, ``> /dev/full``; a closed descriptor, ``>&-``): one ``hfcache: error:`` line
  on stderr and exit 5 (a filesystem problem, docs/cli.md).

After either, file descriptor 1 is pointed at ``/dev/null``, so that flushes of buffered output on the way out write
nowhere instead of failing again. Standard library only; installed by :func:`hfcache.cli.run`.
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


class GuardedStdout:
    """``sys.stdout`` for the program: writes and flushes go to ``stream``; an OSError ends the command (module
    docstring) by raising SystemExit, which click and rich let through."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream if stream is not None else _Closed()

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
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

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, buffer...: the real stream's
        return getattr(self._stream, name)


class _Closed(io.TextIOBase):
    """What ``sys.stdout`` is when descriptor 1 was closed (``>&-``: Python sets it to None)."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


def output_failed(exc: OSError) -> NoReturn:
    """End the command after ``exc`` writing stdout: 141 for a reader gone, else one error line and exit 5."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    if isinstance(exc, BrokenPipeError):
        raise SystemExit(EXIT_BROKEN_PIPE)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"hfcache: error: cannot write to standard output: {exc.strerror or exc}\n"
                         "hint: redirect the output to a writable file (or /dev/null)\n")
        sys.stderr.flush()
    raise SystemExit(EXIT_OUTPUT_FAILED)


def stop_waiting_for_reader() -> None:
    """Make writes to stdout fail instead of wait when its reader does not read (a Ctrl-C or SIGTERM must end the
    command at once, even with ``hfcache ls --json | slow-consumer``)."""
    with contextlib.suppress(OSError, ValueError):
        os.set_blocking(1, False)
