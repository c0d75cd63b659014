"""Reading a streamed answer's body with a check at every chunk off the wire: the deadline of a metadata answer,
the throughput floor of a file body (:mod:`hfcache.pace`), and a bounded read of an error answer's body.

No HTTP client is imported here (only :mod:`hfcache.hub.client` makes requests): these take the response it opened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..pace import Deadline, Throughput, TooSlow
from .retry import SlowBody

if TYPE_CHECKING:
    import httpx2


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
    """Give a streamed response the (bounded) body already read, so ``hf_raise_for_status`` reads its message from
    it instead of reading the stream itself.

    Library gap: ``hf_raise_for_status`` (``_format``) calls ``response.read()`` on a streamed error answer: the
    whole body, unbounded and with no deadline. ``Response._content`` is what ``read()`` fills (private).
    """
    response._content = content
