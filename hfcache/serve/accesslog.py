"""The request log: what the server saw (:class:`RequestRecord`, for tests) and the access log line per request."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from .http import PRINTABLE, raw_target

__all__ = ["LogEntry", "RequestRecord"]


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server saw it (main or CDN origin).

    Attributes:
        origin (str): ``"hub"`` (main origin) or ``"cdn"`` (LFS origin).
        method (str): HTTP method, e.g. ``"HEAD"``.
        path (str): raw request target as sent: path and query string, still URL-encoded.
        status (int): HTTP status code answered.
        authorized (bool): whether the request carried an ``Authorization`` header (any value).
        bytes_sent (int): body bytes handed to the socket (0 for HEAD and redirects).
        range (str | None): the ``Range`` header as sent, e.g. ``"bytes=1048576-"``; None without one.
    """

    origin: str
    method: str
    path: str
    status: int
    authorized: bool
    bytes_sent: int
    range: str | None = None


class LogEntry:
    """Mutable while its body streams; frozen into a RequestRecord when read."""

    __slots__ = ("origin", "method", "path", "status", "authorized", "bytes_sent", "started", "wall", "range")

    def __init__(self, origin: str, environ: Mapping[str, Any]):
        self.origin = origin
        self.method = environ["REQUEST_METHOD"]
        self.path = raw_target(environ)
        self.authorized = "HTTP_AUTHORIZATION" in environ
        self.range = environ.get("HTTP_RANGE")
        self.status = 0
        self.bytes_sent = 0
        self.started = time.monotonic()
        self.wall = time.time()

    def freeze(self) -> RequestRecord:
        return RequestRecord(self.origin, self.method, self.path, self.status, self.authorized, self.bytes_sent,
                             self.range)

    def access_line(self) -> str:
        """``TIME METHOD PATH STATUS BYTES SECONDS``: never a header, so never the Authorization token."""
        when = datetime.fromtimestamp(self.wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        # The target is attacker-controlled: percent-escape whitespace and control bytes so a line stays a line.
        path = quote(self.path, safe=PRINTABLE) or "-"
        seconds = time.monotonic() - self.started
        return f"{when} {self.method} {path} {self.status} {self.bytes_sent} {seconds:.3f}\n"

