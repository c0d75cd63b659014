"""Deadlines and minimum throughput for what a peer sends: a slow peer cannot hold a command forever.

A socket timeout bounds the wait for each byte only: a peer dripping one byte a second never trips it, and a
4 MiB manifest at 1 B/s takes 48 days. So every metadata answer (repo info, manifests, configs, token answers) is
read under a :class:`Deadline` for the whole answer, and every body under a :class:`Throughput` floor averaged over a
window. Readers must hand each chunk as it arrives (httpx ``iter_raw``/``iter_bytes``; urllib3 ``read1``), never a
blocking ``read(n)`` that waits for ``n`` bytes, so the checks run while a drip is under way.

Defaults (documented in docs/security.md, "Deadlines"): a metadata answer gets :data:`METADATA_DEADLINE` seconds, or
:data:`DEADLINE_PER_TIMEOUT` times the command's ``--timeout`` when that is less (at least
:data:`MIN_METADATA_DEADLINE`: :func:`metadata_deadline`); bodies at least :data:`MIN_RATE` bytes/s over any
:data:`RATE_WINDOW` seconds. ``HFCACHE_METADATA_DEADLINE`` (seconds; it wins over ``--timeout``),
``HFCACHE_MIN_RATE`` (a size, e.g. ``1KB``; ``0`` turns the floor off) and ``HFCACHE_RATE_WINDOW`` change them.
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
#: A command's ``--timeout`` tightens that deadline to this many timeouts (:func:`metadata_deadline`). A legitimate
#: answer spends up to one ``--timeout`` connecting, up to one more before its first byte (a server building a large
#: listing), then streams; 12 leaves room for that and a large answer, and is exactly 120 s at the Hub commands'
#: default ``--timeout`` of 10 s, so nobody who kept the default sees another deadline. ``--timeout`` only ever
#: tightens it: a larger one (the registry commands' default 60 s) keeps 120 s, and a hostile peer's drip is never
#: allowed longer because a user raised a per-byte wait; ``HFCACHE_METADATA_DEADLINE`` is the way to loosen it.
DEADLINE_PER_TIMEOUT = 12
#: The least deadline ``--timeout`` derives, in seconds: a sub-second ``--timeout`` still leaves time for a TLS
#: handshake and an ordinary answer.
MIN_METADATA_DEADLINE = 10.0
#: The largest number of seconds an ``HFCACHE_*`` duration may give (about 115 days; ``threading.Timer`` refuses
#: more than ``threading.TIMEOUT_MAX``, and a deadline past it would end in a thread's traceback).
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
    """Seconds allowed for a whole metadata answer (docs/security.md, "Deadlines").

    ``HFCACHE_METADATA_DEADLINE`` when it is set (and not ``0``), whatever ``timeout`` is; else ``timeout`` tightens
    :data:`METADATA_DEADLINE`: ``min(METADATA_DEADLINE, max(MIN_METADATA_DEADLINE, DEADLINE_PER_TIMEOUT * timeout))``
    (``--timeout`` 10 or more: 120 s; 3: 36 s; 0.5: 10 s); with no ``timeout``, :data:`METADATA_DEADLINE`.

    Args:
        timeout (float | None): the command's ``--timeout`` (seconds per wait for a connection or a byte).

    Returns:
        float: seconds, > 0.

    Raises:
        UsageError: the variable is not a number of seconds from 0 to :data:`MAX_SETTING_SECONDS`.
    """
    explicit = _env_float("HFCACHE_METADATA_DEADLINE", 0.0)
    if explicit:
        return explicit
    if timeout is None or not timeout > 0:
        return METADATA_DEADLINE
    return min(METADATA_DEADLINE, max(MIN_METADATA_DEADLINE, DEADLINE_PER_TIMEOUT * timeout))


def min_rate() -> tuple[int, float]:
    """``(bytes per second, window seconds)`` of the body throughput floor (``HFCACHE_MIN_RATE``, a size like
    ``1KB``, ``0`` = off; ``HFCACHE_RATE_WINDOW`` seconds).

    Raises:
        UsageError: a variable is malformed.
    """
    from .units import parse_size

    raw = os.environ.get("HFCACHE_MIN_RATE")
    rate = MIN_RATE if raw in (None, "") else (0 if raw.strip() == "0" else parse_size(raw))
    return rate, _env_float("HFCACHE_RATE_WINDOW", RATE_WINDOW) or RATE_WINDOW


@dataclass
class Deadline:
    """An overall deadline: :meth:`check` raises once ``seconds`` have passed since creation.

    Args:
        seconds (float): the allowance.
        what (str): names the answer in the error, e.g. ``"repo info of gpt2 from http://hub"``.
    """

    seconds: float
    what: str
    start: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        """Seconds left (never below 0)."""
        return max(0.0, self.start + self.seconds - time.monotonic())

    def check(self) -> None:
        """Raises:
            TooSlow: the deadline has passed.
        """
        if time.monotonic() - self.start > self.seconds:
            raise TooSlow(f"{self.what}: no complete answer within {self.seconds:g} s")


@dataclass
class Throughput:
    """A floor on a body's average rate: :meth:`feed` raises when fewer than ``rate * window`` bytes arrived in the
    last ``window`` seconds (checked once ``window`` seconds have passed since the start).

    Args:
        rate (int): bytes per second; 0 turns the floor off.
        window (float): seconds averaged over.
        what (str): names the body in the error.
    """

    rate: int
    window: float
    what: str
    start: float = field(default_factory=time.monotonic)
    _mark: float = 0.0
    _since_mark: int = 0

    def __post_init__(self) -> None:
        self._mark = self.start

    def feed(self, n: int) -> None:
        """Count ``n`` bytes just received (call with 0 to check on a wait).

        Raises:
            TooSlow: the window that just ended averaged below the floor.
        """
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
    """Holds a :class:`Deadline` from outside a blocked read: when it passes, every socket registered with
    :meth:`watch` is shut down, so a read waiting on a drip returns and its request fails.

    Library gap (http.client and urllib3 for registries; httpx2/httpcore2/h11 for the Hub): their timeouts bound each
    read, not a whole answer, and status lines and headers are read in loops no body check sees, so one byte within
    the timeout each holds a request for hours. The HTTP side finds the socket (:mod:`hfcache.hub.bodies`,
    :mod:`hfcache.oci.peer`); a duplicate of it is kept here and shut down (closing it would not wake a reader).
    A socket registered after the deadline passed is shut down at once.

    Args:
        deadline (Deadline): the allowance. armed (bool): start the timer now (else at :meth:`arm`).
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
