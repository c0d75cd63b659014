"""The contract between the protocol side and a server stack (:class:`Responder`: what :mod:`.asgi` calls,
``HubServer`` implements), :class:`FileBody`, the file body a stack streams in constant memory, and :class:`LogEntry`,
one request's access log entry."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, BinaryIO, Protocol
from urllib.parse import quote

from .http import PRINTABLE, raw_target

__all__ = ["BODY_CHUNK", "FileBody", "LogEntry", "Responder"]

# Body reads: 256 KiB per read. werkzeug's 8 KiB default halved throughput (benchmarks/bench_serve.py).
BODY_CHUNK = 256 * 1024
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None


class LogEntry:
    """A request (method, raw target ``path``), its answer's ``status`` and the body ``bytes_sent`` so far."""

    __slots__ = ("method", "path", "status", "bytes_sent", "started", "wall")

    def __init__(self, environ: Mapping[str, Any]):
        self.method = environ["REQUEST_METHOD"]
        self.path = raw_target(environ)
        self.status = 0
        self.bytes_sent = 0
        self.started = time.monotonic()
        self.wall = time.time()

    def access_line(self) -> str:
        """``TIME METHOD PATH STATUS BYTES SECONDS``: never a header, so never the Authorization token."""
        when = datetime.fromtimestamp(self.wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        # The target is attacker-controlled: percent-escape whitespace and control bytes so a line stays a line.
        path = quote(self.path, safe=PRINTABLE) or "-"
        seconds = time.monotonic() - self.started
        return f"{when} {self.method} {path} {self.status} {self.bytes_sent} {seconds:.3f}\n"


class Responder(Protocol):
    """What a server stack needs from the protocol side (:class:`hfcache.serve.HubServer`)."""

    def respond(self, origin: str, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], Iterable[bytes],
                                                                      LogEntry]:
        """Answer one request given as a WSGI environ: (status line, headers, body, log entry). The body is a
        :class:`FileBody` for file bytes, else a short iterable; the caller streams it, adds to ``entry.bytes_sent``
        and calls :meth:`finish` exactly once, after the last byte or on failure."""

    def finish(self, entry: LogEntry) -> None:
        """A response is over: account for it once."""

    @property
    def stopping(self) -> threading.Event:
        """Set when responses still streaming must end now."""


class FileBody:
    """A file, or one byte range of it, as a response body read in ``BODY_CHUNK`` pieces (constant memory)."""

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
        """The next piece if the page cache has it (Linux ``preadv(RWF_NOWAIT)``), else None: a read would wait for
        the device (call :meth:`read` from a worker thread), or no RWF_NOWAIT here, or an in-memory body."""
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

