"""Peers that misbehave on purpose, for the adversarial tests: :class:`PeerServer`, the one hand-written HTTP
server of the suite, its route builders, and :class:`HostileServer`, a Hub of one repo with a fault at a time.

The suite's Hub is the test Hub (``tests/testhub``, tests/README.md): real repos, real answers, and the faults a
misbehaving Hub or CDN shows (429s, cut bodies, pacing). A :class:`PeerServer` is for what no real server sends and so
the test Hub cannot: lies in headers and JSON (hashes, sizes, commits, paths), answers dripped a byte at a time or
never ending, redirects to other origins, a registry with its own auth or a proxy that stalls. Standard library only
(``http.server``), so an answer can be anything a broken proxy could send.

``HostileServer`` serves one small repo, ``evil/repo``, whose one file ``tokenizer.json`` is honest unless a fault
says otherwise. Its request log counts what was asked.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.client
import json
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT = b'{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}\n'
COMMIT = hashlib.sha1(b"evil commit").hexdigest()
#: An answer: writes the whole response to the handler (status line, headers, body).
Route = Callable[[BaseHTTPRequestHandler], None]
#: Headers a proxy does not pass on (hop by hop, or recomputed from the body it sends).
HOP_HEADERS = ("content-length", "transfer-encoding", "connection")


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object id


FAULTS = (
    "dotdot_path", "absolute_path", "backslash_path", "bad_hash", "size_larger", "size_smaller", "redirect_loop",
    "endless_body", "stall_mid_body", "invalid_json", "error_500", "bad_commit", "gzip_bomb", "gzip_bomb_404",
    "deep_json", "file_and_folder",
    # Mirrors without ?blobs=true metadata: the fallbacks' answers are validated too.
    "bad_tree_oid", "bad_head_etag", "head_without_size",
)
_NO_BLOBS = ("bad_tree_oid", "bad_head_etag", "head_without_size")


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """A gzip body of ~260 KiB that inflates to 256 MiB: a repo info whose JSON is padded with spaces."""
    head = json.dumps({"id": "evil/repo", "sha": COMMIT, "siblings": []}).encode()[:-1] + b', "pad": "'
    out = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    parts = [out.compress(head)]
    block = b" " * (1 << 20)
    parts += [out.compress(block) for _ in range(256)]
    parts.append(out.compress(b'"}') + out.flush())
    return b"".join(parts)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _any(self) -> None:
        peer: PeerServer = self.server  # type: ignore[assignment]
        peer.log.append((self.command, self.path, self.headers.get("Authorization")))
        peer._record(self)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            peer._answer(self, self.command == "HEAD")

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any


class PeerServer(ThreadingHTTPServer):
    """A threaded HTTP/1.1 server on 127.0.0.1 playing a peer the test Hub cannot (the module's docstring).

    It answers by ``routes`` (path prefix -> :data:`Route`, the longest prefix first; 404 otherwise), or a subclass
    answers in ``_answer(handler, head)`` and may log more in ``_record(handler)``. ``log`` holds (method, path,
    Authorization) of every request. ``host`` is how clients name it (``127.0.0.1`` or ``localhost``: two origins),
    ``endpoint`` its URL; ``stop`` is set on exit (for answers that drip forever). ``with PeerServer() as peer:``.
    """

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.log: list[tuple[str, str, str | None]] = []
        self.routes: dict[str, Route] = {}
        self.stop = threading.Event()
        # A handler class of its own: a server may set class attributes (disable_nagle_algorithm) for itself alone.
        super().__init__(("127.0.0.1", 0), type("Handler", (_Handler,), {}))
        self.host = f"{host}:{self.server_port}"
        self.endpoint = f"http://{self.host}"

    def _record(self, h: BaseHTTPRequestHandler) -> None:
        """Log one request beyond ``log`` (nothing by default)."""

    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        if length:
            h.rfile.read(length)
        path = h.path.split("?")[0]
        route = next((self.routes[p] for p in sorted(self.routes, key=len, reverse=True) if path.startswith(p)), None)
        (route or (lambda h: send(h, 404, b'{"errors": []}')))(h)

    def authorizations(self) -> list[str]:
        return [auth for _, _, auth in self.log if auth]

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()


# --- answers ---------------------------------------------------------------------------------------------------------


def send(h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    """One whole answer (``Content-Length`` from the body unless ``headers`` set it; no body for a HEAD)."""
    h.send_response(status)
    for key, value in (headers or {}).items():
        h.send_header(key, value)
    if "Content-Length" not in (headers or {}):
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def body(data: bytes, **headers: str) -> Route:
    return lambda h: send(h, 200, data, headers)


def drip(data: bytes, interval: float, headers: dict[str, str] | None = None) -> Route:
    """Headers at once, then ``data`` one byte every ``interval`` seconds (until the client or the test stops)."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        peer: PeerServer = h.server  # type: ignore[assignment]
        h.send_response(200)
        for key, value in {"Content-Length": str(len(data)), **(headers or {})}.items():
            h.send_header(key, value)
        h.end_headers()
        for i in range(len(data)):
            if peer.stop.wait(interval):
                return
            h.wfile.write(data[i:i + 1])
            h.wfile.flush()
    return answer


def drip_headers(content_type: str) -> Route:
    """A status line, then a header one byte every half second: http.client waits for the blank line."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        peer: PeerServer = h.server  # type: ignore[assignment]
        h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type.encode())
        for byte in b"x" * 60_000:
            if peer.stop.wait(0.5):
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
    return answer


EMPTY_GZIP = gzip.compress(b"", mtime=0)  # a gzip member holding nothing


def empty_gzip_members(headers: dict[str, str]) -> Route:
    """An endless body of empty gzip members, sent as fast as the client reads: it inflates to nothing."""
    def answer(h: BaseHTTPRequestHandler) -> None:
        peer: PeerServer = h.server  # type: ignore[assignment]
        h.send_response(200)
        for key, value in headers.items():
            h.send_header(key, value)
        h.end_headers()
        block = EMPTY_GZIP * 2000
        while not peer.stop.is_set():
            h.wfile.write(block)
            time.sleep(0.005)
    return answer


def forward(h: BaseHTTPRequestHandler, upstream: str, path: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
    """Send the request ``h`` holds (its method, body, and its headers or ``headers``) to ``upstream``
    (``host:port``) at ``path`` (default: the same path); return the answer (status, headers less
    :data:`HOP_HEADERS`, whole body) for the proxy to pass on or alter."""
    data = h.rfile.read(int(h.headers.get("Content-Length") or 0))
    if headers is None:
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP_HEADERS}
    conn = http.client.HTTPConnection(upstream, timeout=30)
    try:
        conn.request(h.command, path or h.path, data if h.command in ("POST", "PUT", "PATCH") else None, headers)
        answer = conn.getresponse()
        return answer.status, [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_HEADERS], answer.read()
    finally:
        conn.close()


# --- a Hub of one repo, with a fault -----------------------------------------------------------------------------


class HostileServer(PeerServer):
    """Run with ``with HostileServer("stall_mid_body") as server: server.endpoint``."""

    def __init__(self, fault: str) -> None:
        assert fault in FAULTS, fault
        self.fault = fault
        if fault.startswith("gzip_bomb"):
            gzip_bomb()  # built before the first request, not within the client's timeout
        self.requests: list[str] = []
        super().__init__()

    def _record(self, h) -> None:
        self.requests.append(f"{h.command} {h.path}")

    # ------------------------------------------------------------------ answers

    def _send(self, h, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _answer(self, h, head: bool) -> None:
        fault = self.fault
        path = h.path.split("?")[0]
        if fault == "error_500":
            self._send(h, 500, b'{"error": "internal"}', {"Content-Type": "application/json"}, head)
            return
        if fault in ("gzip_bomb", "gzip_bomb_404") and path.startswith("/api/"):
            status = 404 if fault == "gzip_bomb_404" else 200
            self._send(h, status, gzip_bomb(), {"Content-Type": "application/json", "Content-Encoding": "gzip",
                                                "X-Error-Code": "RepoNotFound"} if status == 404 else
                       {"Content-Type": "application/json", "Content-Encoding": "gzip"}, head)
            return
        if fault == "deep_json" and path.startswith("/api/"):
            body = b'{"id": "evil/repo", "sha": "' + COMMIT.encode() + b'", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/api/models/evil/repo/tree/"):
            if fault != "bad_tree_oid":
                self._send(h, 404, b'{"error": "not found"}', {"Content-Type": "application/json"}, head)
                return
            entries = [{"type": "file", "path": "tokenizer.json", "size": len(CONTENT), "oid": "Z" * 40}]
            self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/api/models/evil/repo"):
            name = {"dotdot_path": "../../outside.json", "absolute_path": "/etc/evil.json",
                    "backslash_path": "..\\evil.json"}.get(fault, "tokenizer.json")
            sibling = {"rfilename": name} if fault in _NO_BLOBS else \
                {"rfilename": name, "size": len(CONTENT), "blobId": git_sha1(CONTENT)}
            info = {"id": "evil/repo", "sha": "not-a-commit" if fault == "bad_commit" else COMMIT,
                    "siblings": [sibling]}
            if fault == "file_and_folder":  # a path both a file and a folder: half a snapshot would be published
                info["siblings"].append({"rfilename": "tokenizer.json/tokenizer_config.json", "size": len(CONTENT),
                                         "blobId": git_sha1(CONTENT)})
            body = b'{"id": "evil/repo", "sha": ' if fault == "invalid_json" else json.dumps(info).encode()
            self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        if path.startswith("/evil/repo/resolve/"):
            self._resolve(h, head)
            return
        self._send(h, 404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"}, head)

    def _resolve(self, h, head: bool) -> None:
        fault = self.fault
        base = {"X-Repo-Commit": COMMIT, "ETag": f'"{git_sha1(CONTENT)}"'}
        if fault == "bad_head_etag":
            base["ETag"] = '"d41d8cd98f00b204e9800998ecf8427e"'  # an md5, as some proxies send
        if fault == "head_without_size" and head:  # no Content-Length: the size is unknown
            h.send_response(200)
            for k, v in base.items():
                h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            return
        if fault == "redirect_loop":
            self._send(h, 302, b"", {**base, "Location": h.path}, head)
            return
        if fault == "bad_hash":
            self._send(h, 200, CONTENT.replace(b"UNK", b"XXX"), base, head)
            return
        if fault == "size_larger":  # claims more bytes than it sends, then closes
            h.send_response(200)
            for k, v in {**base, "Content-Length": str(len(CONTENT) + 100), "Connection": "close"}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(CONTENT)
            h.close_connection = True
            return
        if fault == "size_smaller":  # claims fewer bytes than the file has
            self._send(h, 200, CONTENT[:-10], {**base, "Content-Length": str(len(CONTENT) - 10)}, head)
            return
        if fault == "endless_body":
            h.send_response(200)
            for k, v in {**base, "Transfer-Encoding": "chunked"}.items():
                h.send_header(k, v)
            h.end_headers()
            chunk = b"x" * 65536
            while not self.stop.is_set():
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        if fault == "stall_mid_body":
            h.send_response(200)
            for k, v in {**base, "Content-Length": str(len(CONTENT))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(CONTENT[:20])
            h.wfile.flush()
            self.stop.wait(120)  # never finishes while the test runs
            return
        self._send(h, 200, CONTENT, base, head)
