"""Retries of transient Hub and CDN failures (what and why: docs/warm.md, ``--retries``): exponential backoff with
jitter, ``Retry-After`` honoured, a budget per request or file download. Library gap: ``http_backoff`` also retries
500 and timeouts, sleeps uninterruptibly and keeps no count.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from typing import TypeVar

from ..errors import HfcacheError, HubError
from ..pace import TooSlow
from ..records import DEFAULT_RETRIES

T = TypeVar("T")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
BASE_DELAY = 0.25  # seconds before the first retry; doubles each time
MAX_DELAY = 10.0
MAX_RETRY_AFTER = 60.0  # a longer Retry-After fails the request instead of stalling the warm


class Interrupted(HfcacheError):
    """Ctrl-C or SIGTERM arrived: the work stopped without publishing anything partial."""

    exit_code = 130


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception's ``.response`` carries (HfHubHTTPError, HTTPStatusError), or None."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def is_transient(exc: BaseException) -> bool:
    """True for a retried failure that needs no HTTP client to recognise: status 429, 502, 503 or 504, a reset
    connection, a body that ended early (:class:`ShortBody`) or too slowly (:class:`SlowBody`)."""
    if (status := status_of(exc)) is not None:
        return status in RETRY_STATUSES
    return isinstance(exc, (ConnectionResetError, ShortBody, SlowBody))


class ShortBody(Exception):
    """A body ended (cleanly) before the announced number of bytes: the connection was cut."""


class SlowBody(TooSlow):
    """A file body fell below the throughput floor: retried like a cut connection within the same budget."""


def retry_after(exc: BaseException) -> float | None:
    """Seconds from the failed answer's ``Retry-After`` (delay-seconds or HTTP-date, RFC 9110 10.2.3), or None."""
    response = getattr(exc, "response", None)
    value = getattr(response, "headers", {}).get("Retry-After") if response is not None else None
    if not value:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


class RetryCounter:
    """Retries and requests made for one repo (thread-safe): what the report shows.

    Args:
        retries: retries per request or per file download (a fresh :meth:`budget` each), >= 0 (else ValueError).
        stop: set to interrupt every backoff wait at once (Ctrl-C, SIGTERM).
        transient: which failures are retried (``HubClient`` passes :func:`hfcache.hub.client.is_transient`).
    """

    def __init__(self, retries: int = DEFAULT_RETRIES, stop: threading.Event | None = None,
                 transient: Callable[[BaseException], bool] = is_transient) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.retries = retries
        self.stop = stop or threading.Event()
        self.transient = transient
        self._count = 0
        self._requests = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return self._count

    @property
    def requests(self) -> int:
        """HTTP requests sent on this counter's behalf: every attempt, retry and redirect hop."""
        return self._requests

    def budget(self) -> Budget:
        """A fresh budget of ``retries`` for one request or one file download."""
        return Budget(self)

    def _add(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


_local = threading.local()


@contextlib.contextmanager
def counting(counter: RetryCounter) -> Iterator[None]:
    """Credit ``counter`` with every request this thread sends inside the block (:func:`count_request`); nests."""
    previous = getattr(_local, "counter", None)
    _local.counter = counter
    try:
        yield
    finally:
        _local.counter = previous


def count_request(request: object) -> None:
    """HTTP client request hook (redirect hops included): one more request for the counter :func:`counting` made current
    in this thread."""
    counter = getattr(_local, "counter", None)
    if counter is not None:
        counter._add("_requests")


class Budget:
    """The retries left for one request (or one file's download, shared by its parts)."""

    def __init__(self, counter: RetryCounter, rng: random.Random | None = None) -> None:
        self.counter = counter
        self.left = counter.retries
        self.attempt = 0
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    def backoff(self, exc: BaseException, what: str) -> bool:
        """After a failure: wait and return True when it should be retried, False when it should be raised. Raises
        Interrupted (stopped while waiting), HubError (a ``Retry-After`` over :data:`MAX_RETRY_AFTER`)."""
        if not self.counter.transient(exc):
            return False
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            self.attempt += 1
            attempt = self.attempt
        self.counter._add("_count")
        delay = retry_after(exc)
        if delay is not None and delay > MAX_RETRY_AFTER:
            raise HubError(f"{what}: rate-limited, the endpoint asks to retry after {delay:.0f} s",
                           hint="retry later, or use another --endpoint")
        if delay is None:
            # "Equal jitter": half fixed, half random, so that parallel parts do not retry in lockstep.
            step = min(MAX_DELAY, BASE_DELAY * 2 ** (attempt - 1))
            delay = step / 2 + self._rng.uniform(0, step / 2)
        if self.counter.stop.wait(delay):
            raise Interrupted(f"{what}: interrupted")
        return True

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` until it succeeds, a failure is not transient, or the budget is spent (then it raises)."""
        while True:
            if self.counter.stop.is_set():
                raise Interrupted(f"{what}: interrupted")
            try:
                with counting(self.counter):
                    return fn()
            except Exception as exc:  # classified by backoff(), re-raised when not retried
                if not self.backoff(exc, what):
                    raise
