"""The test Hub on werkzeug's threaded server (in-process, instant start): the WSGI app (metering, pacing, resets)
and an origin in a thread. The protocol is :meth:`hfcache.serve.HubServer.respond` (the
:class:`hfcache.serve.body.Responder` contract), the code ``hfcache serve`` runs on uvicorn; this only moves bytes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from hfcache.serve.body import FileBody, LogEntry, Responder

from .faults import RESET, reset_midway

__all__ = ["WerkzeugOrigin", "wsgi_app"]


def wsgi_app(responder: Responder, origin: str, throttle_bps: int | None) -> Any:
    """A WSGI application answering ``origin`` (``"hub"`` or ``"cdn"``) through ``responder``.

    Bodies are counted into the log entry as they go, paced to about ``throttle_bps`` bytes/s if set, and cut
    short once ``responder.stopping`` is set; ``responder.finish`` runs once per response. A body whose environ
    :mod:`.faults` marked (``RESET``) is cut after half its bytes, the TCP connection reset.
    """

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        status, headers, body, entry = responder.respond(origin, environ)
        start_response(status, headers)
        chunks: Iterable[bytes] = body
        if throttle_bps is not None and isinstance(body, FileBody):
            chunks = _throttled(body, throttle_bps, responder.stopping)
        if isinstance(body, FileBody) and environ.get(RESET):
            chunks = reset_midway(chunks, body.length, environ)
        return _metered(responder, chunks, entry)

    return app


def _metered(responder: Responder, chunks: Iterable[bytes], entry: LogEntry) -> Iterator[bytes]:
    stopping = responder.stopping
    try:
        for chunk in chunks:
            if stopping.is_set():
                return
            # Counted before the write, so the count is final by the time a client has every byte.
            entry.bytes_sent += len(chunk)
            yield chunk
    finally:
        close(chunks)
        responder.finish(entry)


def _throttled(chunks: Iterable[bytes], bps: int, stopping: threading.Event) -> Iterator[bytes]:
    """Re-chunk a body and pace it to about ``bps`` bytes/s; ends early when the server stops."""
    step = max(1, min(64 * 1024, bps // 20))  # ~20 writes a second keeps the rate smooth
    start, sent = time.monotonic(), 0
    try:
        for chunk in chunks:
            for offset in range(0, len(chunk), step):
                piece = chunk[offset : offset + step]
                yield piece
                sent += len(piece)
                # Event.wait instead of sleep: stop() must not wait for a slow transfer to finish.
                if stopping.wait(max(0.0, start + sent / bps - time.monotonic())):
                    return
    finally:
        close(chunks)


def close(iterable: object) -> None:
    """Close a response body if it has a ``close`` method (WSGI, PEP 3333)."""
    closer = getattr(iterable, "close", None)
    if closer is not None:
        closer()


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """HubServer.requests and the access log are the logs; werkzeug's would spam stderr."""


class WerkzeugOrigin:
    """One origin on werkzeug's threaded server, in a background thread."""

    def __init__(self, host: str, port: int, app: Any) -> None:
        try:
            self.server = make_server(host, port, app, threaded=True, request_handler=_QuietHandler)
        except SystemExit as exc:  # werkzeug exits the process on bind errors; a library must raise
            raise OSError(f"cannot listen on {host}:{port}") from exc
        self.port = self.server.port
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=f"HubServer:{self.port}", daemon=True)
        self.thread.start()

    def close_listener(self, grace: float) -> None:
        self.server.shutdown()
        self.server.server_close()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)

