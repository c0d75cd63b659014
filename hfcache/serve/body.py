"""The contract between the protocol side and a server stack (:class:`Responder`: what :mod:`.asgi` calls,
``HubServer`` implements), and :class:`FileBody`, the file body a stack streams in constant memory."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, Protocol

from .accesslog import LogEntry

__all__ = ["BODY_CHUNK", "FileBody", "Responder"]

# Body reads: 256 KiB per read. werkzeug's 8 KiB default halved throughput (benchmarks/bench_serve.py).
BODY_CHUNK = 256 * 1024
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None


class Responder(Protocol):
    """What a server stack needs from the protocol side: :class:`hfcache.serve.HubServer`."""

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      LogEntry]:
        """Answer one request given as a WSGI environ: (status line, headers, body, log entry)."""

    def finish(self, entry: LogEntry) -> None:
        """A response is over: account for it once."""

    @property
    def stopping(self) -> threading.Event:
        """Set when responses still streaming must end now."""


class FileBody:
    """A file, or one byte range of it, as a response body read in ``BODY_CHUNK`` pieces (constant memory): iterated
    (WSGI), or :meth:`read` in a worker thread (:mod:`.asgi`)."""

    def __init__(self, file: BinaryIO, start: int, length: int) -> None:
        self.file, self.start, self.length = file, start, length
        self.remaining = length
        self._positioned = False

    def read(self) -> bytes:
        """The next piece, ``b""`` at the end (also when the file shrank under us: the client sees a short body)."""
        if self.remaining <= 0:
            return b""
        if not self._positioned:
            self.file.seek(self.start + self.length - self.remaining)
            self._positioned = True
        data = self.file.read(min(BODY_CHUNK, self.remaining))
        self.remaining = self.remaining - len(data) if data else 0
        return data

    def read_cached(self) -> bytes | None:
        """The next piece if the kernel has it in the page cache, without blocking on the disk; None if a read
        would wait for the device (then call :meth:`read` from a worker thread). Linux ``preadv(RWF_NOWAIT)``;
        elsewhere, and for in-memory bodies, always None."""
        if self.remaining <= 0:
            return b""
        if _RWF_NOWAIT is None:
            return None
        try:
            fd = self.file.fileno()
        except (OSError, AttributeError, io.UnsupportedOperation):
            return None
        buffer = bytearray(min(BODY_CHUNK, self.remaining))
        try:
            n = os.preadv(fd, [buffer], self.start + self.length - self.remaining, _RWF_NOWAIT)
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP: filesystem without RWF_NOWAIT
            return None
        if n == 0:
            self.remaining = 0
            return b""
        self.remaining -= n
        self._positioned = False  # read() seeks again before continuing
        return bytes(memoryview(buffer)[:n])

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read():
            yield chunk

    def close(self) -> None:
        self.file.close()

