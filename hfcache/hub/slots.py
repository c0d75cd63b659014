"""Connection slots shared by a whole run (:class:`Slots`; docs/warm.md "Large files in parallel ranges")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .retry import Interrupted

__all__ = ["Slots"]


class Slots:
    """Connections the whole warm may hold at once (``--max-workers``). Waiting honours the stop event. It also
    knows who else wants one: threads waiting (:meth:`acquire`) and large files announced but not started
    (:meth:`expect`), so a file takes a spare slot (:meth:`try_spare`) only when nobody else would."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._cond = threading.Condition()
        self._free = self.size
        self._waiting = 0
        self._expected = 0

    def acquire(self, stop: threading.Event, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait for a slot (Interrupted when ``stop`` is set); False, no slot taken, once ``give_up()`` is true."""
        with self._cond:
            self._waiting += 1
            try:
                while self._free == 0:
                    self._cond.wait(0.1)
                    if stop.is_set():
                        raise Interrupted("interrupted while waiting for a connection slot")
                    if give_up():
                        return False
                self._free -= 1
                return True
            finally:
                self._waiting -= 1

    def release(self) -> None:
        with self._cond:
            self._free = min(self.size, self._free + 1)
            self._cond.notify()

    def fair_share(self, cap: int) -> int:
        """Spare slots taken at once for a file's extra parts (at most ``cap``): the free ones no waiting thread
        wants, divided among this file and the announced ones."""
        with self._cond:
            spare = self._free - self._waiting - self._expected
            take = max(0, min(cap, spare // (self._expected + 1)))
            self._free -= take
            return take

    def try_spare(self) -> bool:
        """Take a slot only if one is free and no thread waits and no announced file is still to start."""
        with self._cond:
            if self._free == 0 or self._waiting or self._expected:
                return False
            self._free -= 1
            return True

    @contextmanager
    def expect(self, count: int) -> Iterator[Callable[[], None]]:
        """Announce ``count`` large files about to start; yields ``arrived()``, called once as each starts (extra
        calls do nothing); the rest is withdrawn when the block ends."""
        left = [max(0, count)]
        with self._cond:
            self._expected += left[0]

        def arrived() -> None:
            with self._cond:
                if left[0]:
                    left[0] -= 1
                    self._expected -= 1

        try:
            yield arrived
        finally:
            with self._cond:
                self._expected -= left[0]
                left[0] = 0

    @contextmanager
    def held(self, stop: threading.Event) -> Iterator[None]:
        """One slot for the block (a repo's resolution request); Interrupted when ``stop`` is set while waiting."""
        self.acquire(stop)
        try:
            yield
        finally:
            self.release()
