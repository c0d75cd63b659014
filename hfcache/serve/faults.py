"""Faults a test Hub server can inject: what mirrors, proxies and flaky networks do to clients.

One frozen :class:`Faults` configures them; :class:`FaultState` counts what has been injected so far (the "first N"
faults) for one server. :class:`hfcache.serve.HubServer` consults it at a few hooks: the main origin's routing
(rate limit, :mod:`.routing`), the API routes (no ``?blobs=true``, no tree API, repo info only by revision), the
file answer (ETags, ``Range``, failing bodies, :mod:`.answers`) and body streaming (resets, :mod:`.wsgi`).
Standard library only; imports nothing of the server. Werkzeug backend only (a reset needs the raw socket).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_BODY_FAILURES = ("502", "503", "reset")
_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class Faults:
    """Misbehaviours to inject (all off by default).

    Attributes:
        no_blobs (bool): repo info ignores ``?blobs=true``: siblings carry ``rfilename`` only.
        no_tree (bool): the tree API answers 404.
        info_needs_revision (bool): repo info without ``/revision/<rev>`` answers 404.
        unquoted_etags (bool): ``ETag`` and ``X-Linked-Etag`` values without quotes.
        no_range (bool): ``Range`` is ignored (always 200 with the whole body) and ``Accept-Ranges`` is not sent.
        rate_limit (int): the first N main-origin requests answer 429 with ``Retry-After``.
        retry_after (int): seconds sent in ``Retry-After`` (whole seconds, as the Hub sends them).
        failing_bodies (int): the first N file-body GETs (resolve or CDN) fail.
        body_failure (str): how they fail: ``"502"``/``"503"`` (an error answer) or ``"reset"`` (the connection is
            cut after half the body was sent).
        latency_ms (int): every answer waits this many milliseconds before it starts (a remote Hub's round
            trip; the loopback has none).
    """

    no_blobs: bool = False
    no_tree: bool = False
    info_needs_revision: bool = False
    unquoted_etags: bool = False
    no_range: bool = False
    rate_limit: int = 0
    retry_after: int = 1
    failing_bodies: int = 0
    body_failure: str = "503"
    latency_ms: int = 0

    def __post_init__(self) -> None:
        if self.body_failure not in _BODY_FAILURES:
            raise ValueError(f"body_failure must be one of {_BODY_FAILURES}, got {self.body_failure!r}")
        if min(self.rate_limit, self.failing_bodies, self.retry_after, self.latency_ms) < 0:
            raise ValueError("fault counts and retry_after must be >= 0")

    def etag(self, value: str) -> str:
        """An ETag header value: quoted, as the Hub sends it, or bare (``unquoted_etags``)."""
        return value if self.unquoted_etags else f'"{value}"'


def parse_faults(specs: Iterable[str]) -> Faults:
    """Faults from ``NAME`` (a boolean switched on) or ``NAME=VALUE`` strings, e.g. ``["no_blobs", "rate_limit=3"]``.

    Raises:
        ValueError: an unknown name or a value of the wrong type.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        name, sep, raw = spec.partition("=")
        field = Faults.__dataclass_fields__.get(name)
        if field is None:
            raise ValueError(f"unknown fault {name!r}: one of {', '.join(Faults.__dataclass_fields__)}")
        kind = type(getattr(Faults(), name))
        if kind is bool:
            if sep and raw.lower() not in _BOOLEANS:
                raise ValueError(f"fault {name} is on or off ({', '.join(sorted(_BOOLEANS))}), got {raw!r}")
            values[name] = _BOOLEANS[raw.lower()] if sep else True
        elif kind is int:
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"fault {name} takes a whole number, got {raw!r}") from None
        else:
            values[name] = raw
    return Faults(**values)


class FaultState:
    """The injection counters of one server (thread-safe)."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._lock = threading.Lock()
        self._limited = 0
        self._failed_bodies = 0

    def take_rate_limit(self) -> bool:
        """True (and counted) while the first ``rate_limit`` requests are being answered."""
        return self._take("_limited", self.faults.rate_limit)

    def take_body_failure(self) -> bool:
        """True (and counted) while the first ``failing_bodies`` body GETs are being answered."""
        return self._take("_failed_bodies", self.faults.failing_bodies)

    def _take(self, counter: str, limit: int) -> bool:
        with self._lock:
            if getattr(self, counter) >= limit:
                return False
            setattr(self, counter, getattr(self, counter) + 1)
            return True


def reset_midway(chunks: Iterable[bytes], length: int, environ: Mapping[str, Any]) -> Iterator[bytes]:
    """Send about half of a body of ``length`` bytes, then cut the TCP connection (a CDN dropping a transfer).

    Raises ConnectionResetError after shutting the socket down, which werkzeug treats as a dropped connection
    (no error page written into the half-sent body).
    """
    budget = max(1, length // 2)
    sent = 0
    try:
        for chunk in chunks:
            piece = chunk[: budget - sent]
            if piece:
                yield piece
                sent += len(piece)
            if sent >= budget:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    raise ConnectionResetError("fault: connection reset mid-body")
