"""Streamed answers read with a check at every chunk off the wire (a deadline, a throughput floor: :mod:`hfcache.pace`),
and the :class:`Watchdog` holding a whole metadata answer, headers included, to its deadline. No HTTP client is
imported; the HTTP libraries' private APIs used are behind :func:`_httpx2_decoder` and :func:`_httpcore2_socket`."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..pace import Deadline, SocketWatchdog, Throughput, TooSlow
from .retry import SlowBody

if TYPE_CHECKING:
    import httpx2

#: The hint of a missed deadline or throughput floor: ``--timeout`` (below 10 s) also sets the metadata deadline.
SLOW_HINT = ("the endpoint is too slow: retry later, use another --endpoint, or raise --timeout / "
             "HFCACHE_METADATA_DEADLINE / lower HFCACHE_MIN_RATE")


def iter_body(response: httpx2.Response, on_raw: Callable[[int], None]) -> Iterator[bytes]:
    """The decoded body of a streamed response; ``on_raw(n)`` runs for every raw chunk off the wire (``n`` >= 1) before
    it is decoded, so a check runs on a one-byte drip too. Raises what ``on_raw`` raises, httpx2 errors."""
    decoder = _httpx2_decoder(response)
    for raw in response.iter_raw():
        on_raw(len(raw))
        for piece in decoder.decode(raw):
            if piece:
                yield piece
    for piece in decoder.flush():
        if piece:
            yield piece


def _httpx2_decoder(response: httpx2.Response):
    """The response's own content decoder (httpx2's private ``Response._get_content_decoder``)."""
    # Library gap: iter_bytes yields only non-empty chunks (an endless run of empty gzip members reaches no check).
    return response._get_content_decoder()


def slow_body(floor: Throughput, n: int) -> None:
    """Feed ``n`` bytes of a file body to ``floor``; SlowBody (retried) when it fell below."""
    try:
        floor.feed(n)
    except TooSlow as exc:
        raise SlowBody(str(exc)) from None


def read_capped(response: httpx2.Response, deadline: Deadline, cap: int) -> bytes:
    """At most ``cap`` decoded bytes of a streamed (error) body, within ``deadline``; the rest is not read."""
    body = bytearray()
    for piece in iter_body(response, lambda n: deadline.check()):
        body += piece
        if len(body) >= cap:
            break
    return bytes(body[:cap])


_local = threading.local()  # .dog: the Watchdog of the request this thread is sending


class Watchdog(SocketWatchdog):
    """Enforces one metadata answer's :class:`Deadline` from outside: when it passes, the request's socket is shut down,
    so a read blocked on a drip of headers returns. The socket is registered by httpx2's ``trace`` extension, which
    :func:`watch_hook` sets on every request (redirects included) sent while a dog is armed in the thread."""

    def trace(self, event: str, info: dict) -> None:
        """httpx2 ``trace`` callback: registers the connection's socket when the request headers go out."""
        if event.endswith(".send_request_headers.started"):
            self.watch(_httpcore2_socket())


def _httpcore2_socket() -> socket.socket | None:
    """The socket of the httpcore2 connection sending the request (a ``trace`` callback's caller), or None."""
    # Library gap: no trace event names the connection of a request on a reused one, and the network_stream extension
    # (encode/httpcore#724) arrives after the headers a drip holds back: the private _network_stream up the stack.
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        stream = getattr(frame.f_locals.get("self"), "_network_stream", None)
        if stream is not None:
            with contextlib.suppress(Exception):
                return stream.get_extra_info("socket")
            return None
        frame = frame.f_back
    return None


def watch_hook(request) -> None:
    """httpx2 request event hook: a request sent while a :func:`watched` block is open gets its dog's ``trace``."""
    dog = getattr(_local, "dog", None)
    if dog is not None:
        request.extensions = {**request.extensions, "trace": dog.trace}


@contextlib.contextmanager
def watched(deadline: Deadline) -> Iterator[Watchdog]:
    """Hold the requests this thread sends inside the block to ``deadline``; TooSlow once it passed (whatever error the
    shut-down socket caused)."""
    dog, previous = Watchdog(deadline), getattr(_local, "dog", None)
    _local.dog = dog
    try:
        yield dog
    except TooSlow:
        raise
    except Exception as exc:
        if dog.fired:
            raise TooSlow(f"{deadline.what}: no complete answer within {deadline.seconds:g} s") from exc
        raise
    finally:
        _local.dog = previous
        dog.stop()
