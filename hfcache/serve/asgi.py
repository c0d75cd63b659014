"""HubServer on uvicorn, in a background thread; the protocol is :meth:`hfcache.serve.HubServer.respond`, this module
only moves bytes. ``respond`` runs in a worker thread, then the body streams from the event loop one ``BODY_CHUNK``
at a time (from the page cache without blocking, else read in a worker thread), ``send`` waiting for the socket to
drain: one chunk of memory per connection, and idle or slow connections cost no thread.
"""

from __future__ import annotations

import asyncio
import io
import resource
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .body import FileBody, Responder

__all__ = ["UvicornOrigin"]

#: Seconds an idle keep-alive connection stays open (nginx's default is 75, load balancers' 60).
KEEP_ALIVE_SECONDS = 65
#: Worker threads for ``respond`` and file reads (blocking filesystem work), shared by all connections.
WORKER_THREADS = 32
#: Paths answered from a pool of their own: probes and scrapes must answer while every worker waits on an upstream
#: fetch (a pull-through mirror under a cold start), or the kubelet would restart a mirror that is merely busy.
PROBE_PATHS = frozenset({"/healthz", "/metrics"})
PROBE_THREADS = 4
#: Seconds a client has to send a request's line and headers, counted from its connection or from the first byte
#: after a response. uvicorn has no such timeout: a connection that never finishes its request stays open forever.
HEADER_TIMEOUT_SECONDS = 30.0
#: Connections open at once, at most (files being served need descriptors too); one more is closed as soon as it is
#: accepted, a request beyond ``limit_concurrency`` (the same number) gets 503, which huggingface_hub retries.
MAX_CONNECTIONS = max(64, min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64))
#: Largest request line + headers, bytes (h11's default). uvicorn's ``h11_max_incomplete_event_size`` only bounds a
#: head still incomplete in its buffer, so :meth:`UvicornOrigin._app` measures every head and answers 431.
MAX_REQUEST_HEAD_BYTES = 16 * 1024


def request_head_bytes(scope: dict[str, Any]) -> int:
    """The bytes of a request's line and headers as sent (CRLFs and the blank line included), from an ASGI scope."""
    line = len(scope["method"]) + len(scope.get("raw_path") or scope["path"].encode()) + 12
    query = scope.get("query_string") or b""
    line += len(query) + 1 if query else 0
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


async def _too_large(send: Any) -> None:
    """431 (RFC 6585: Request Header Fields Too Large), closing the connection."""
    body = f"request line and headers larger than {MAX_REQUEST_HEAD_BYTES} bytes\n".encode()
    await send({"type": "http.response.start", "status": 431,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class UvicornOrigin:
    """One origin of a HubServer served by uvicorn in a background thread: bound to ``host``/``port`` (0: any free
    port, ``self.port``), answered by ``server`` (a Responder) as ``origin``, with ``extra_workers`` threads beyond
    WORKER_THREADS (a pull-through mirror's upstream slots). Raises OSError: the port cannot be bound, or uvicorn did
    not start within 10 seconds."""

    def __init__(self, host: str, port: int, server: Responder, origin: str, *, extra_workers: int = 0) -> None:
        self._hub, self._origin = server, origin
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(2048)  # a storm of pods connecting at once must not overflow the SYN backlog
        except OSError:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self._pool = ThreadPoolExecutor(max_workers=WORKER_THREADS + extra_workers,
                                        thread_name_prefix=f"hfcache-serve-{origin}")
        self._probe_pool = ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix=f"hfcache-probe-{origin}")
        # log_config None: the process's logging is left alone; access_log False: HubServer writes its own (without
        # headers, so without tokens); proxy_headers False: the access log shows what the socket saw. The keep-alive
        # outlasts any client's idle expiry (httpx: 5 s), so the client always closes an idle connection first: with
        # equal timeouts a request sent as the server closes gets a reset, and huggingface_hub does not retry a HEAD
        # (benchmarks/bench_serve.py failed with ECONNRESET at uvicorn's 5 s).
        config = uvicorn.Config(self._app, interface="asgi3", lifespan="off", log_config=None, access_log=False,
                                server_header=False, proxy_headers=False, timeout_graceful_shutdown=None,
                                timeout_keep_alive=KEEP_ALIVE_SECONDS, limit_concurrency=MAX_CONNECTIONS,
                                http=_bounded_protocol(HEADER_TIMEOUT_SECONDS, MAX_CONNECTIONS),
                                h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)
        self._server = uvicorn.Server(config)
        # Not the main thread: uvicorn installs no signal handlers there; the caller owns SIGTERM/SIGINT.
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"hfcache-serve:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise OSError(f"uvicorn did not start on {host}:{port}")
            time.sleep(0.01)

    def close_listener(self, grace: float) -> None:
        """Stop accepting; idle keep-alive connections close, busy ones finish within ``grace`` seconds."""
        self._server.config.timeout_graceful_shutdown = max(grace, 0.1)
        if grace <= 0:
            self._server.force_exit = True
        self._server.should_exit = True

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probe_pool.shutdown(wait=False, cancel_futures=True)

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if request_head_bytes(scope) > MAX_REQUEST_HEAD_BYTES:
            await _too_large(send)
            return
        loop = asyncio.get_running_loop()
        environ = _environ(scope)
        pool = self._probe_pool if scope["path"] in PROBE_PATHS else self._pool
        status, headers, body, entry = await loop.run_in_executor(pool, self._hub.respond, self._origin,
                                                                  environ)
        disconnected = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, disconnected))
        stopping = self._hub.stopping
        try:
            await send({
                "type": "http.response.start",
                "status": int(status.split(" ", 1)[0]),
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            })
            if isinstance(body, FileBody):
                while True:
                    chunk = body.read_cached()  # page-cache hit: no thread hop
                    if chunk is None:
                        chunk = await loop.run_in_executor(self._pool, body.read)
                    if not chunk:
                        break
                    if stopping.is_set() or disconnected.is_set():
                        return  # incomplete response: uvicorn closes the connection, the client sees a short body
                    entry.bytes_sent += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                data = b"".join(body)  # JSON and error documents: small
                entry.bytes_sent += len(data)
                await send({"type": "http.response.body", "body": data, "more_body": False})
        finally:
            watcher.cancel()
            close = getattr(body, "close", None)
            if close is not None:
                await loop.run_in_executor(self._pool, close)
            self._hub.finish(entry)


def _bounded_protocol(header_timeout: float, max_connections: int) -> type:
    """uvicorn's HTTP protocol with what it lacks (library gap, uvicorn 0.54: ``timeout_keep_alive`` only runs
    between requests, ``limit_concurrency`` only answers requests that arrive): a deadline for a request's headers
    and a cap on open connections."""

    class BoundedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer = None
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout, self._head_timeout, self.cycle)

        def _head_timeout(self, cycle_when_armed) -> None:
            self._head_timer = None
            if self.cycle is cycle_when_armed and not self.transport.is_closing():  # no new request began
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not None and not self.cycle.response_complete:
                self._head_timer.cancel()  # a request began: its headers are complete
                self._head_timer = None
            elif self._head_timer is None and (self.cycle is None or self.cycle.response_complete) \
                    and not self.transport.is_closing():
                self._arm()  # bytes of a next request: its headers must follow in time

        def connection_lost(self, exc) -> None:
            if getattr(self, "_head_timer", None) is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return BoundedProtocol


async def _watch_disconnect(receive: Any, disconnected: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            return


def _environ(scope: dict[str, Any]) -> dict[str, Any]:
    """A WSGI environ (PEP 3333) for an ASGI HTTP scope; the request target stays as sent in ``RAW_URI``."""
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
    query = scope.get("query_string", b"")
    server = scope.get("server") or ("127.0.0.1", 0)
    client = scope.get("client")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": "",
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "RAW_URI": raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else ""),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "REMOTE_ADDR": client[0] if client else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(b""),  # GET and HEAD only: request bodies are never read
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in scope.get("headers", []):
        key = name.decode("latin-1").upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
        text = value.decode("latin-1")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ
