"""The pull-through mirror's upstream work in a bounded pool of its own, so a slow upstream never starves cached
answers (docs/serve.md, "A slow upstream never starves cached answers"); the server stack adds ``slots`` worker
threads to its own (:mod:`.asgi`) for the requests waiting here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TypeVar

from ..pace import Deadline, metadata_deadline, min_rate
from .vocabulary import StoreMiss

__all__ = ["DEFAULT_UPSTREAM_SLOTS", "MAX_UPSTREAM_SLOTS", "UpstreamPool", "fetch_deadline", "resolve_deadline"]

#: Upstream operations (and requests waiting on them) at once, by default (``--upstream-slots``).
DEFAULT_UPSTREAM_SLOTS = 32
#: The most ``--upstream-slots`` accepts (each slot is a thread of the pool and one of the server).
MAX_UPSTREAM_SLOTS = 256
#: Seconds a client is told to wait (``Retry-After``) when the pool is full or a deadline passed.
RETRY_AFTER = 2

T = TypeVar("T")


def resolve_deadline(what: str, timeout: float | None = None) -> Deadline:
    """The deadline of a revision's resolution: :func:`hfcache.pace.metadata_deadline` of ``timeout`` (seconds)."""
    return Deadline(metadata_deadline(timeout), what)


def fetch_deadline(size: int, what: str) -> Deadline | None:
    """The deadline of a file of ``size`` bytes at the throughput floor (:func:`hfcache.pace.min_rate`): the window
    plus ``size / rate`` seconds; None when the floor is off."""
    rate, window = min_rate()
    if rate <= 0:
        return None
    return Deadline(window + size / rate, what)


def _busy(message: str) -> StoreMiss:
    return StoreMiss("UpstreamUnavailable", message, status=503, retry_after=RETRY_AFTER)


class UpstreamPool:
    """At most ``slots`` (int, >= 1) upstream operations, one per key, and at most ``slots`` requests waiting."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._closed = False
        self._waiting = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._ops: dict[Hashable, Future] = {}
        self._local = threading.local()

    def run(self, key: Hashable, fn: Callable[[], T], deadline: Deadline | None) -> T:
        """``fn()``'s result, run once per ``key`` in the pool (a request for a key in flight waits for that run);
        ``fn`` must re-check what it fetches. Called from inside an operation, it runs inline (or waits for the twin).
        Raises StoreMiss: 503 ``UpstreamUnavailable`` with ``retry_after`` when every slot is taken or ``deadline``
        passed (the operation goes on); whatever ``fn`` raises."""
        if getattr(self._local, "inside", False):
            with self._lock:
                running = self._ops.get(key)
            return fn() if running is None else running.result()
        if not self._waiting.acquire(blocking=False):
            raise _busy(f"this mirror is waiting on upstream for {self.slots} requests already; retry shortly")
        try:
            with self._lock:
                future = self._ops.get(key)
                if future is None:
                    if len(self._ops) >= self.slots or self._closed:
                        raise _busy(f"this mirror runs {self.slots} upstream fetches already; retry shortly")
                    future = Future()
                    self._ops[key] = future
                    # A daemon thread per operation (at most ``slots``), not a ThreadPoolExecutor: its threads are
                    # joined at interpreter exit, so an upstream dripping bytes would hold up the mirror's shutdown.
                    threading.Thread(target=self._op, args=(key, fn, future), name="hfcache-upstream",
                                     daemon=True).start()
            try:
                return future.result(timeout=None if deadline is None else deadline.remaining())
            except TimeoutError:
                raise _busy(f"{deadline.what}: upstream gave no complete answer within {deadline.seconds:g} s "
                            "(--timeout, HFCACHE_METADATA_DEADLINE, HFCACHE_MIN_RATE); it is still being fetched, "
                            "retry later") from None
        finally:
            self._waiting.release()

    def _op(self, key: Hashable, fn: Callable[[], T], future: Future) -> None:
        self._local.inside = True
        try:
            result = fn()
        except BaseException as exc:  # handed to every waiter, as a ThreadPoolExecutor would
            with self._lock:
                self._ops.pop(key, None)
            future.set_exception(exc)
        else:
            with self._lock:
                self._ops.pop(key, None)
            future.set_result(result)

    def close(self) -> None:
        """Stop taking work; running operations finish in their daemon threads (not waited for)."""
        with self._lock:
            self._closed = True
