"""Deadlines and minimum throughput for what a peer sends: a slow peer cannot hold a command forever.

A socket timeout bounds each wait only (a 4 MiB manifest at 1 B/s takes 48 days), so every metadata answer is read
under a :class:`Deadline` for the whole answer, and every body under a :class:`Throughput` floor, each chunk handed
over as it arrives, never a blocking ``read(n)``. Defaults and their variables: docs/security.md, "Deadlines".
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from .errors import UsageError

METADATA_DEADLINE = 120.0  #: seconds for a whole metadata answer (headers and body), at most, unless configured
#: A command's ``--timeout`` tightens that deadline to this many timeouts: up to one ``--timeout`` to connect, one
#: before the first byte, then the answer; exactly 120 s at the Hub commands' default 10 s. Only ever tightened: a
#: drip is never allowed longer because a user raised a per-byte wait (``HFCACHE_METADATA_DEADLINE`` loosens it).
DEADLINE_PER_TIMEOUT = 12
#: The least deadline ``--timeout`` derives (seconds): time for a TLS handshake and an ordinary answer.
MIN_METADATA_DEADLINE = 10.0
#: The most seconds an ``HFCACHE_*`` duration may give (~115 days; ``threading.Timer`` refuses more than
#: ``threading.TIMEOUT_MAX``).
MAX_SETTING_SECONDS = 1e7
MIN_RATE = 1024  #: bytes per second a body must average over RATE_WINDOW
RATE_WINDOW = 60.0  #: seconds the throughput floor is averaged over (and the grace before it applies)


class TooSlow(Exception):
    """A peer missed a deadline or fell below the throughput floor; ``str()`` is one line naming what and how."""


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_SETTING_SECONDS:
        raise UsageError(f"invalid {name}={raw!r}", hint=f"give a number of seconds from 0 to {MAX_SETTING_SECONDS:g}, "
                         "e.g. 120")
    return value


def metadata_deadline(timeout: float | None = None) -> float:
    """Seconds allowed for a whole metadata answer: ``HFCACHE_METADATA_DEADLINE`` when set (not ``0``); else
    ``min(METADATA_DEADLINE, max(MIN_METADATA_DEADLINE, DEADLINE_PER_TIMEOUT * timeout))`` (``--timeout`` 10 or more:
    120 s; 3: 36 s; 0.5: 10 s). UsageError: the variable is not seconds from 0 to :data:`MAX_SETTING_SECONDS`."""
    explicit = _env_float("HFCACHE_METADATA_DEADLINE", 0.0)
    if explicit:
        return explicit
    if timeout is None or not timeout > 0:
        return METADATA_DEADLINE
    return min(METADATA_DEADLINE, max(MIN_METADATA_DEADLINE, DEADLINE_PER_TIMEOUT * timeout))


def min_rate() -> tuple[int, float]:
    """``(bytes per second, window seconds)`` of the body throughput floor: ``HFCACHE_MIN_RATE`` (a size like ``1KB``;
    ``0``: off), ``HFCACHE_RATE_WINDOW``. UsageError when one is malformed."""
    from .units import parse_size

    raw = os.environ.get("HFCACHE_MIN_RATE")
    rate = MIN_RATE if raw in (None, "") else (0 if raw.strip() == "0" else parse_size(raw))
    return rate, _env_float("HFCACHE_RATE_WINDOW", RATE_WINDOW) or RATE_WINDOW


@dataclass
class Deadline:
    """An overall deadline: :meth:`check` raises TooSlow, naming ``what``, ``seconds`` after creation."""

    seconds: float
    what: str
    start: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        """Seconds left (never below 0)."""
        return max(0.0, self.start + self.seconds - time.monotonic())

    def check(self) -> None:
        if time.monotonic() - self.start > self.seconds:
            raise TooSlow(f"{self.what}: no complete answer within {self.seconds:g} s")


@dataclass
class Throughput:
    """A floor on a body's average rate: :meth:`feed` raises TooSlow, naming ``what``, when fewer than
    ``rate * window`` bytes (``rate`` 0: no floor) arrived in the last ``window`` seconds."""

    rate: int
    window: float
    what: str
    start: float = field(default_factory=time.monotonic)
    _mark: float = 0.0
    _since_mark: int = 0

    def __post_init__(self) -> None:
        self._mark = self.start

    def feed(self, n: int) -> None:
        """Count ``n`` bytes just received (0: check on a wait); TooSlow when the window just ended was too slow."""
        self._since_mark += n
        now = time.monotonic()
        if self.rate <= 0 or now - self._mark < self.window:
            return
        if self._since_mark < self.rate * (now - self._mark):
            got = self._since_mark / (now - self._mark)
            raise TooSlow(f"{self.what}: {got:.0f} B/s over {now - self._mark:.0f} s, below the floor of "
                          f"{self.rate} B/s (HFCACHE_MIN_RATE)")
        self._mark, self._since_mark = now, 0


class SocketWatchdog:
    """Holds a :class:`Deadline` from outside a blocked read: when it passes, a duplicate of every socket registered
    with :meth:`watch` (at once, for one registered later) is shut down (closing would not wake a reader), so a read
    waiting on a drip returns. ``armed``: start the timer now (else a subclass calls ``_arm`` when the wait begins).
    Library gap (http.client, urllib3, httpx2/httpcore2/h11): their timeouts bound each read, and status lines and
    headers are read in loops no body check sees, so one byte per timeout holds a request for hours.
    """

    def __init__(self, deadline: Deadline, *, armed: bool = True) -> None:
        self.deadline, self.fired = deadline, False
        self._lock, self._socks, self._stopped = threading.Lock(), [], False
        self._timer: threading.Timer | None = None
        if armed:
            with self._lock:
                self._arm()

    def watch(self, sock: socket.socket | None) -> None:
        """Register ``sock`` (shut down when the deadline passes; at once if it has)."""
        if sock is None:
            return
        with self._lock:
            if not self._stopped:
                self._register(sock)

    def _register(self, sock: socket.socket) -> None:  # the lock is held
        with contextlib.suppress(OSError):
            self._socks.append(socket.fromfd(sock.fileno(), sock.family, sock.type))
            if self.fired:
                self._socks[-1].shutdown(socket.SHUT_RDWR)

    def _arm(self) -> None:  # the lock is held
        if self._timer is None and not self._stopped:
            self._timer = threading.Timer(self.deadline.remaining(), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = not self._stopped
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Cancel the timer and close the duplicated sockets (idempotent)."""
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()
            for sock in self._socks:
                sock.close()
            self._socks = []
