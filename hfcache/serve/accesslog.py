"""One request's access log entry: counted while its body streams, one line when it ends."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from .http import PRINTABLE, raw_target

__all__ = ["LogEntry"]


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
