"""Thread pools and waits that Ctrl-C and SIGTERM can interrupt: the main thread never blocks without a timeout.

Library gap: CPython runs signal handlers in the main thread only, and only when that thread next executes bytecode.
Linux may hand a process-directed signal (``kill``, Ctrl-C) to any thread that does not block it; when a worker
thread receives it, the main thread's blocking wait is not interrupted (no ``EINTR`` there), so the handler, and
with it ``KeyboardInterrupt``, waits until that wait ends on its own. The waits concerned are those without a
timeout: ``Future.result()``, ``Executor.map()``, ``Thread.join()``, and leaving ``with ThreadPoolExecutor(...)``
(which joins every worker). Measured: ``hfcache warm``'s Ctrl-C took 27 s instead of 0.1 s in 2 of 11 runs, the time
the first repo's download still needed (tests/integration/test_warm.py). Waiting in slices of
:data:`POLL_SECONDS` lets the handler run; an interrupted pool is shut down without joining its workers (they stop
on their own stop event, or die with the process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["POLL_SECONDS", "join", "ordered", "pool"]

T = TypeVar("T")

POLL_SECONDS = 0.1  # the longest a pending Ctrl-C/SIGTERM waits for the main thread


def ordered(futures: Sequence[Future[T]], poll: float = POLL_SECONDS) -> Iterator[T]:
    """Each future's result in the given order, as ``Executor.map`` yields them (raising what a future raised, in
    its turn), with interruptible waits."""
    for future in futures:
        while not future.done():
            wait([future], timeout=poll)
        yield future.result()


def join(threads: Iterable[threading.Thread], poll: float = POLL_SECONDS) -> None:
    """Join every thread, in slices of ``poll`` seconds so that signal handlers run meanwhile."""
    for thread in threads:
        while thread.is_alive():
            thread.join(poll)


@contextmanager
def pool(max_workers: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A ``ThreadPoolExecutor`` of ``max_workers`` threads named ``name-N``, shut down as usual when left normally
    (after :func:`ordered`); left by an exception (Ctrl-C, SIGTERM, an error), its queued work
    is cancelled and the running workers are not waited for."""
    executor = ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix=name)
    try:
        yield executor
    except BaseException:
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    executor.shutdown(wait=True)
