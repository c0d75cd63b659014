"""Reading a streamed answer's body with a check at every chunk off the wire: the deadline of a metadata answer,
the throughput floor of a file body (:mod:`hfcache.pace`), a bounded read of an error answer's body, and the
:class:`Watchdog` that holds a whole metadata answer, its status line and headers included, to its deadline.

No HTTP client is imported here (only :mod:`hfcache.hub.client` makes requests): these take the response it opened.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..pace import Deadline, SocketWatchdog, Throughput, TooSlow
from .answers import error_document
from .retry import SlowBody

if TYPE_CHECKING:
    import httpx2

#: The hint of a missed deadline or throughput floor (:mod:`hfcache.pace`): a larger ``--timeout`` (below 10 s) also
#: raises the metadata deadline, which is 12 timeouts (``pace.metadata_deadline``).
SLOW_HINT = ("the endpoint is too slow: retry later, use another --endpoint, or raise --timeout / "
             "HFCACHE_METADATA_DEADLINE / lower HFCACHE_MIN_RATE")


def iter_body(response: httpx2.Response, on_raw: Callable[[int], None]) -> Iterator[bytes]:
    """The decoded body of a streamed response; ``on_raw(n)`` runs for every raw chunk as it arrives off the wire
    (``n`` >= 1 bytes), before it is decoded, so a deadline or throughput check runs on a one-byte drip too.

    Library gap: httpx2's ``iter_bytes`` yields only non-empty decoded chunks (``ByteChunker``), so raw bytes that
    decode to nothing (an endless run of empty gzip members) never reach a check made per yielded chunk. This reads
    ``iter_raw`` and decodes with the response's own decoder (``Response._get_content_decoder``, private; the same
    decoders ``iter_bytes`` uses).

    Raises:
        what ``on_raw`` raises; httpx2 errors (``DecodingError``, ``ReadError``...).
    """
    decoder = response._get_content_decoder()
    for raw in response.iter_raw():
        on_raw(len(raw))
        for piece in decoder.decode(raw):
            if piece:
                yield piece
    for piece in decoder.flush():
        if piece:
            yield piece


def slow_body(floor: Throughput, n: int) -> None:
    """Feed ``n`` bytes of a file body to ``floor``; a breach is a :class:`hfcache.hub.retry.SlowBody` (retried).

    Raises:
        SlowBody: the body fell below the floor.
    """
    try:
        floor.feed(n)
    except SlowBody:
        raise
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


def keep_content(response: httpx2.Response, content: bytes) -> None:
    """Give a streamed error response the (bounded) body already read, so ``hf_raise_for_status`` reads its message
    from it instead of reading the stream itself, rebuilt as a JSON object of strings it can read
    (:func:`hfcache.hub.answers.error_document`: a body of another JSON type was exit 70).

    Library gap: ``hf_raise_for_status`` (``_format``) calls ``response.read()`` on a streamed error answer: the
    whole body, unbounded and with no deadline. ``Response._content`` is what ``read()`` fills (private).
    """
    response._content = error_document(content, response.headers.get("Content-Type", ""))


_local = threading.local()  # .dog: the Watchdog of the request this thread is sending


class Watchdog(SocketWatchdog):
    """Enforces one metadata answer's :class:`Deadline` from outside (:class:`hfcache.pace.SocketWatchdog`): when it
    passes, the socket of the request is shut down, so a read blocked on a drip of response headers returns.

    The socket is found through httpx2's ``trace`` request extension, which :func:`watch_hook` sets on every request
    sent while a dog is armed in the thread (redirects included): at ``*.send_request_headers.started`` the
    connection object (``HTTP11Connection``/``HTTP2Connection``, private ``_network_stream``) is its caller's
    ``self``.

    Args:
        deadline (Deadline): the allowance, counted from its creation.
    """

    def trace(self, event: str, info: dict) -> None:
        """httpx2 ``trace`` callback: registers the connection's socket when the request headers go out."""
        if event.endswith(".send_request_headers.started"):
            self.watch(_caller_socket())


def _caller_socket() -> socket.socket | None:
    """The socket of the httpcore2 connection up the calling stack (``self._network_stream``), or None."""
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
    """httpx2 request event hook: gives a request sent while a :func:`watched` block is open its dog's ``trace``."""
    dog = getattr(_local, "dog", None)
    if dog is not None:
        request.extensions = {**request.extensions, "trace": dog.trace}


@contextlib.contextmanager
def watched(deadline: Deadline) -> Iterator[Watchdog]:
    """Hold the requests this thread sends inside the block to ``deadline`` (:class:`Watchdog`).

    Raises:
        TooSlow: the deadline passed (whatever error the shut-down socket caused inside the block).
    """
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
